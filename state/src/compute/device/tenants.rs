//! The tenants of a device ledger: finding and adding them, their identities and labels, their
//! scheduling state read sane from untrusted words, the waiting slots, and the per-tenant counters.

use super::*;

impl DeviceLedger {
    /// Finds the tenant `id`, or adds it with these settings (an entry that no live process uses is
    /// recycled when the table is full). Its label is refreshed. Caller holds the lock. On a node
    /// whose policy gives the tenant an entry, that entry, written afresh if its words name
    /// another tenant (whoever wrote them); no other tenant is ever added at an entry the policy
    /// gives somebody.
    pub fn find_or_add_tenant(
        &self,
        _g: &LockGuard<'_>,
        id: TenantId,
        label: &str,
        share: u32,
        cap: u32,
        high: bool,
    ) -> Option<usize> {
        let l = self.layout();
        let found = self.policy.entry_of(id).or_else(|| {
            l.tenants.iter().enumerate().position(|(i, t)| {
                t.state.load(Acquire) == TENANT_READY
                    && TenantId::load(&t.id) == id
                    && self.free_for(i, id)
            })
        });
        if let Some(i) = found {
            let t = &l.tenants[i];
            if t.state.load(Acquire) == TENANT_READY && TenantId::load(&t.id) == id {
                for (w, v) in t.name.iter().zip(pack_truncated(label)) {
                    w.store(v, Release);
                }
            } else {
                fill_tenant(t, id, label, share, cap, high);
            }
            self.own.lock().tenant = Some((i, id, label.to_string(), share, cap, high));
            return Some(i);
        }
        let free = (0..MAX_TENANTS)
            .find(|&i| l.tenants[i].state.load(Acquire) != TENANT_READY && self.free_for(i, id));
        let i = free.or_else(|| self.unused_tenant(id))?;
        fill_tenant(&l.tenants[i], id, label, share, cap, high);
        self.own.lock().tenant = Some((i, id, label.to_string(), share, cap, high));
        Some(i)
    }

    /// Whether tenant `id` may be at entry `i`: the policy gives it nobody else.
    fn free_for(&self, i: usize, id: TenantId) -> bool {
        self.policy.reserved(i).map_or(true, |(r, _)| r == id)
    }

    /// The entry tenant `id` belongs at, when it is not `at`: the node's policy gives it another
    /// one, or gives `at` to somebody else (the scheduler thread then joins again).
    pub fn entry_moved(&self, at: usize, id: TenantId) -> bool {
        match self.policy.entry_of(id) {
            Some(e) => e != at,
            None => !self.free_for(at, id),
        }
    }

    /// A tenant entry no live process slot refers to (the table is full: recycle it), and that
    /// the policy gives nobody else than `id`.
    fn unused_tenant(&self, id: TenantId) -> Option<usize> {
        let l = self.layout();
        let mut used = [false; MAX_TENANTS];
        for (i, s) in l.slots.iter().enumerate() {
            let t = s.tenant.load(Acquire) as usize;
            if s.state.load(Acquire) != SLOT_FREE && t < MAX_TENANTS && self.slot_alive(i, None) {
                used[t] = true;
            }
        }
        (0..MAX_TENANTS).find(|&t| !used[t] && self.free_for(t, id))
    }

    /// Puts back tenant entry `i`'s identity and label (our own, whose words were overwritten),
    /// keeping its scheduling state; an entry no longer marked in use is written afresh.
    /// Caller holds the lock.
    pub fn restore_identity(&self, i: usize, id: TenantId, label: &str, v: &TenantView) {
        let Some(t) = self.layout().tenants.get(i) else {
            return;
        };
        if t.state.load(Acquire) != TENANT_READY {
            fill_tenant(t, id, label, v.share, v.cap, v.high);
            return;
        }
        id.store(&t.id);
        for (w, v) in t.name.iter().zip(pack_truncated(label)) {
            w.store(v, Release);
        }
    }

    /// Writes tenant entry `i` afresh (our own, found damaged). Caller holds the lock.
    pub fn rewrite_tenant(&self, i: usize, id: TenantId, label: &str, v: &TenantView) {
        if let Some(t) = self.layout().tenants.get(i) {
            fill_tenant(t, id, label, v.share, v.cap, v.high);
        }
    }

    /// Counts a hand-over to (or, `revocation`, a revocation from) tenant entry `t`, in the
    /// per-tenant counters' file when there is one. Caller holds the arbitration lock. The entry is
    /// taken over from a tenant that no longer holds `t` (from zero); the words are anybody's, so
    /// the count saturates instead of wrapping.
    pub fn count(&self, t: usize, revocation: bool) {
        let Some(TallyMap::Shared(w)) = &self.tally else {
            return;
        };
        let Some(e) = w.layout().tenants.get(t) else {
            return;
        };
        let id = self.tenant_id(t);
        if id.0 == 0 {
            return;
        }
        if TenantId::load(&e.id) != id {
            e.hand_overs.store(0, Release);
            e.revocations.store(0, Release);
            id.store(&e.id);
        }
        let c = if revocation {
            &e.revocations
        } else {
            &e.hand_overs
        };
        c.store(c.load(Acquire).saturating_add(1), Release);
    }

    /// Tenant entry `t`'s hand-overs and revocations (`count`): `None` without the counters'
    /// file; zeros when the file's entry counts for another tenant (or nobody) still.
    pub fn tenant_counts(&self, t: usize) -> Option<(u64, u64)> {
        let e = self.tally.as_ref()?.layout().tenants.get(t)?;
        let id = self.tenant_id(t);
        if id.0 == 0 || TenantId::load(&e.id) != id {
            return Some((0, 0));
        }
        Some((e.hand_overs.load(Acquire), e.revocations.load(Acquire)))
    }

    /// The identity of tenant entry `i`.
    pub fn tenant_id(&self, i: usize) -> TenantId {
        self.layout()
            .tenants
            .get(i)
            .map_or(TenantId(0), |t| TenantId::load(&t.id))
    }

    /// Every tenant that carries the label `name` (admin).
    pub fn find_tenants(&self, name: &str) -> Vec<usize> {
        let Some(key) = pack(name) else {
            return Vec::new();
        };
        (0..MAX_TENANTS)
            .filter(|&i| {
                let t = &self.layout().tenants[i];
                t.state.load(Acquire) == TENANT_READY
                    && t.name.iter().zip(&key).all(|(a, b)| a.load(Acquire) == *b)
            })
            .collect()
    }

    /// The tenant with identity `id`.
    pub fn find_tenant_by_id(&self, id: TenantId) -> Option<usize> {
        (0..MAX_TENANTS).find(|&i| {
            let t = &self.layout().tenants[i];
            t.state.load(Acquire) == TENANT_READY && TenantId::load(&t.id) == id
        })
    }

    /// Finds a tenant by its label (the first one that carries it).
    pub fn find_tenant(&self, name: &str) -> Option<usize> {
        let key = pack(name)?;
        self.layout().tenants.iter().position(|t| {
            t.state.load(Acquire) == TENANT_READY
                && t.name.iter().zip(&key).all(|(a, b)| a.load(Acquire) == *b)
        })
    }

    /// Tenant `i`'s scheduling state, made sane: the file is untrusted (shares and caps within their
    /// ranges, tokens within the bucket's bounds, no time stamp ahead of the clock).
    pub fn view(&self, i: usize) -> TenantView {
        let i = i % MAX_TENANTS;
        let t = &self.layout().tenants[i];
        let now = now_ns();
        let (share, cap, high) = self.settings(i, t);
        TenantView {
            share,
            cap,
            high,
            vtime: t.vtime.load(Acquire),
            tokens: t
                .tokens
                .load(Acquire)
                .clamp(arbiter::MIN_TOKENS_NS, arbiter::BUCKET_NS),
            refill_ns: t.refill_ns.load(Acquire).min(now),
            last_active_ns: t.last_active_ns.load(Acquire).min(now),
        }
    }

    /// Whether tenant `i` is of the high-priority class.
    pub fn is_high(&self, i: usize) -> bool {
        self.layout()
            .tenants
            .get(i)
            .is_some_and(|t| self.settings(i, t).2)
    }

    /// Tenant entry `i`'s share, cap and class: the node's policy for the tenant it gives the
    /// entry, whatever the entry's words say (or, for an entry it gives nobody, for a tenant it
    /// lists without an entry); share 1 and the normal class otherwise (the ledger's words are
    /// anybody's to write: [`Overlay::lookup_entry`]); the ledger's words, bounded, when there is
    /// no policy.
    fn settings(&self, i: usize, t: &TenantEntry) -> (u32, u32, bool) {
        let cap = t.cap.load(Acquire);
        let cap = if cap >= 100 { 0 } else { cap };
        match self.policy.lookup_entry(i, TenantId::load(&t.id)) {
            Lookup::Listed { share, cap, high } => (share, cap, high),
            Lookup::Unlisted => (1, cap, false),
            Lookup::NoPolicy => (
                t.share.load(Acquire).clamp(1, arbiter::MAX_SHARE),
                cap,
                PriorityClass::from_word(t.priority.load(Acquire)) == PriorityClass::High,
            ),
        }
    }

    pub fn store_view(&self, i: usize, v: &TenantView) {
        let t = &self.layout().tenants[i];
        t.vtime.store(v.vtime, Release);
        t.tokens.store(v.tokens, Release);
        t.refill_ns.store(v.refill_ns, Release);
        t.last_active_ns.store(v.last_active_ns, Release);
    }

    /// The live waiting slots (`except` left out).
    pub fn waiters(&self, except: Option<usize>) -> Vec<Waiter> {
        let l = self.layout();
        let now = now_ns();
        (0..MAX_SLOTS)
            .filter(|&i| Some(i) != except)
            .filter_map(|i| {
                let s = &l.slots[i];
                (s.state.load(Acquire) == SLOT_ACTIVE
                    && s.wants.load(Acquire) > 0
                    && now.saturating_sub(s.beat_ns.load(Acquire)) < BEAT_STALE_NS)
                    .then(|| Waiter {
                        slot: i,
                        tenant: s.tenant.load(Acquire) as usize,
                        // Untrusted: a stamp ahead of the clock would put it behind every
                        // other waiter of its tenant for good.
                        since: s.wait_since.load(Acquire).min(now),
                    })
            })
            .filter(|w| w.tenant < MAX_TENANTS && self.slot_counts(w.slot, w.tenant))
            .collect()
    }

    pub fn views(&self) -> Vec<TenantView> {
        (0..MAX_TENANTS).map(|i| self.view(i)).collect()
    }
}

/// Writes a new tenant entry (READY last).
pub(super) fn fill_tenant(
    t: &TenantEntry,
    id: TenantId,
    label: &str,
    share: u32,
    cap: u32,
    high: bool,
) {
    t.state.store(0, Release);
    id.store(&t.id);
    for (w, v) in t.name.iter().zip(pack_truncated(label)) {
        w.store(v, Release);
    }
    t.share.store(share, Release);
    t.cap.store(cap, Release);
    t.priority.store(PriorityClass::of(high).word(), Release);
    t.vtime.store(0, Release);
    t.tokens.store(arbiter::BUCKET_NS, Release);
    t.refill_ns.store(now_ns(), Release);
    t.last_active_ns.store(0, Release);
    t.charged_ns.store(0, Release);
    t.wait_ns.store(0, Release);
    for w in &t.samples {
        w.store(0, Release);
    }
    t.state.store(TENANT_READY, Release);
}
