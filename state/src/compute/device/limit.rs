//! A bound on the process slots of one tenant, so that no tenant filling slots keeps another's
//! processes out.
//!
//! A slot's state and tenant are words every tenant of the GPU can write, and its liveness byte is
//! a lock every tenant can hold: a tenant can mark every free slot in use and hold its byte. What
//! nobody else can fake is a tenant's *own* lock ([`super::slots`]): a process of a tenant with a
//! memory ledger knows which slots labelled with its tenant hold a live process of it. And what a
//! tenant cannot change is the node's policy, which lists the GPU's tenants (root's file).
//!
//! So, on a node (a policy in effect) and for a process claiming with a tenant lock, each tenant
//! may hold at most [`slot_limit`] slots: the slots shared equally among the tenants the policy
//! lists and one more group for everyone it does not list. A claim counts the slots by the tenant
//! their words name (every tenant the policy does not list, and every label that names no tenant,
//! in one group), its own tenant's by its tenant lock (a slot labelled with it that holds no lock
//! of it is not a process of it), and [`decide`]s:
//!
//! * its tenant already holds its limit: no slot (the process runs throttled to its share);
//! * a free slot: taken, as always;
//! * a slot labelled with its own tenant that no process of it holds: taken back;
//! * otherwise a slot of the group that holds the most slots, when that is more than the limit:
//!   taken back: its highest-numbered one (honest claims take the lowest free slot first) or,
//!   with a `pick`, the pick-th from the top. Processes of different tenants that start together
//!   would otherwise all pick the same slot (their tenant locks are in different files), each
//!   take it back, and run on one slot, each rewriting the other's label (seen: shares 10/90 came
//!   out 50/50); a claim picks at random.
//!
//! When every slot is in use and the claimer's tenant holds fewer than its limit, some group holds
//! more than the limit (there are `listed + 1` groups of at most `limit` each in [`MAX_SLOTS`]):
//! a tenant below its limit always gets a slot. Honest processes never make a group exceed the
//! limit (their claims stop at it), so a slot taken back belongs to a group that squats, or to a
//! tenant whose slots outnumber a limit lowered by a new tenant in the policy.

use super::MAX_SLOTS;
use crate::compute::shm::TenantId;

/// What a claim sees of one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    Free,
    /// Labelled with the claimer's tenant; `live`: a process of it holds its tenant lock.
    Ours {
        live: bool,
    },
    /// Labelled with another tenant the policy lists, or (`None`) with anybody else: a tenant the
    /// policy does not list, an entry not in use, a label naming no entry.
    Theirs(Option<TenantId>),
}

/// What the claim does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The claimer's tenant holds its limit already.
    AtLimit,
    /// Take a free slot.
    Free,
    /// Take this slot back (in use, but not by a process that may hold it).
    Reclaim(usize),
    /// Every slot is in use and no group holds more than its limit.
    Full,
}

/// The slots a tenant may hold when the node's policy lists `listed` tenants: an equal part of
/// [`MAX_SLOTS`] for each of them and for everyone it does not list (at least 1).
pub fn slot_limit(listed: usize) -> usize {
    (MAX_SLOTS / listed.saturating_add(1)).max(1)
}

/// The claim's decision (module documentation) over what it sees of every slot; a slot to take
/// back is the `pick`-th from the top of its kind (0: the highest), wrapping round.
pub fn decide(slots: &[Seen], limit: usize, pick: usize) -> Claim {
    let live = slots
        .iter()
        .filter(|s| matches!(s, Seen::Ours { live: true }))
        .count();
    if live >= limit {
        return Claim::AtLimit;
    }
    if slots.contains(&Seen::Free) {
        return Claim::Free;
    }
    let nth_from_top = |kind: &dyn Fn(&Seen) -> bool| {
        let of_kind = slots.iter().filter(|s| kind(s)).count();
        let skip = pick % of_kind.max(1);
        let found = slots
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, s)| kind(s))
            .nth(skip);
        found.map(|(i, _)| i)
    };
    // Our own tenant's: its highest (two of our processes exclude each other by the slot's
    // byte in our tenant's lock file).
    if let Some(i) = slots.iter().rposition(|s| *s == Seen::Ours { live: false }) {
        return Claim::Reclaim(i);
    }
    // The group that holds the most (its highest slot): groups are few, slots 256.
    let mut groups: Vec<(Option<TenantId>, usize, usize)> = Vec::new();
    for (i, s) in slots.iter().enumerate() {
        if let Seen::Theirs(g) = s {
            match groups.iter_mut().find(|(k, _, _)| k == g) {
                Some(e) => {
                    e.1 += 1;
                    e.2 = i;
                }
                None => groups.push((*g, 1, i)),
            }
        }
    }
    match groups.iter().max_by_key(|(_, n, _)| *n) {
        Some(&(g, n, _)) if n > limit => {
            let theirs = |s: &Seen| *s == Seen::Theirs(g);
            nth_from_top(&theirs).map_or(Claim::Full, Claim::Reclaim)
        }
        _ => Claim::Full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Option<TenantId> = Some(TenantId(0xa));
    const B: Option<TenantId> = Some(TenantId(0xb));

    fn filled(with: Seen) -> Vec<Seen> {
        vec![with; MAX_SLOTS]
    }

    #[test]
    fn the_limit_shares_the_slots_among_the_listed_tenants_and_everyone_else() {
        assert_eq!(slot_limit(0), MAX_SLOTS);
        assert_eq!(slot_limit(1), MAX_SLOTS / 2);
        assert_eq!(slot_limit(3), MAX_SLOTS / 4);
        assert_eq!(slot_limit(1000), 1);
        assert_eq!(slot_limit(usize::MAX), 1);
    }

    #[test]
    fn a_free_slot_is_taken_below_the_limit_and_refused_at_it() {
        let mut s = filled(Seen::Free);
        assert_eq!(decide(&s, 4, 0), Claim::Free);
        for slot in s.iter_mut().take(4) {
            *slot = Seen::Ours { live: true };
        }
        assert_eq!(decide(&s, 4, 0), Claim::AtLimit);
        // Slots labelled with us that no process of ours holds do not count.
        s[3] = Seen::Ours { live: false };
        assert_eq!(decide(&s, 4, 0), Claim::Free);
    }

    #[test]
    fn a_squatter_filling_every_slot_under_its_own_label_loses_its_highest_slot() {
        let mut s = filled(Seen::Theirs(A));
        s[0] = Seen::Ours { live: true };
        s[1] = Seen::Theirs(B);
        assert_eq!(decide(&s, 64, 0), Claim::Reclaim(MAX_SLOTS - 1));
    }

    #[test]
    fn a_squatter_labelling_slots_with_the_claimer_loses_them_to_it() {
        let mut s = filled(Seen::Ours { live: false });
        s[0] = Seen::Ours { live: true };
        s[10] = Seen::Theirs(A);
        assert_eq!(decide(&s, 64, 0), Claim::Reclaim(MAX_SLOTS - 1));
    }

    #[test]
    fn labels_of_unlisted_tenants_and_of_nobody_count_as_one_group() {
        // Two listed tenants (limit 85): the other one holds exactly its limit, the unlisted
        // group twice that; the unlisted group loses a slot, the listed tenant none.
        let limit = slot_limit(2);
        let mut s = filled(Seen::Theirs(None));
        for slot in s.iter_mut().skip(2 * limit).take(limit) {
            *slot = Seen::Theirs(A);
        }
        s[MAX_SLOTS - 1] = Seen::Ours { live: true };
        assert_eq!(decide(&s, limit, 0), Claim::Reclaim(2 * limit - 1));
    }

    #[test]
    fn nobody_over_the_limit_leaves_a_full_ledger_full() {
        // Four groups of 64 (limit 64 for three listed tenants): nobody squats.
        let s: Vec<Seen> = (0..MAX_SLOTS)
            .map(|i| match i / 64 {
                0 => Seen::Theirs(A),
                1 => Seen::Theirs(B),
                2 => Seen::Theirs(None),
                _ => Seen::Ours { live: true },
            })
            .collect();
        assert_eq!(decide(&s, 64, 0), Claim::AtLimit);
        let mut s = s;
        s[255] = Seen::Theirs(None);
        // Our tenant below its limit and the unlisted group over it: one of theirs is taken.
        assert_eq!(decide(&s, 64, 0), Claim::Reclaim(255));
    }

    #[test]
    fn claims_that_pick_differently_take_back_different_slots_of_the_same_group() {
        // A squatter's 200 slots (unlisted), then ours: every pick is one of the squatter's, and
        // picks spread over them (two processes starting together must not both take one slot).
        let mut s = filled(Seen::Theirs(None));
        for seen in &mut s[200..] {
            *seen = Seen::Theirs(A);
        }
        let picked: std::collections::BTreeSet<usize> = (0..400)
            .map(|pick| match decide(&s, 64, pick) {
                Claim::Reclaim(i) => i,
                other => panic!("pick {pick}: {other:?}"),
            })
            .collect();
        assert_eq!(picked, (0..200).collect());
        // Slots labelled with our own tenant that no process of it holds: the highest (our
        // processes exclude each other by our tenant's lock file).
        let mut s = filled(Seen::Theirs(None));
        for seen in &mut s[10..20] {
            *seen = Seen::Ours { live: false };
        }
        assert_eq!(decide(&s, 64, 0), Claim::Reclaim(19));
        assert_eq!(decide(&s, 64, 3), Claim::Reclaim(19));
    }

    #[test]
    fn below_the_limit_a_full_ledger_always_has_a_slot_to_take_back() {
        // Whatever the split among the other groups, a tenant below its limit finds a slot.
        for listed in 1..=8usize {
            let limit = slot_limit(listed);
            for ours in 0..limit {
                // The others' slots spread as evenly as possible over `listed` groups (the other
                // listed tenants and the unlisted group): the hardest case.
                let s: Vec<Seen> = (0..MAX_SLOTS)
                    .map(|i| {
                        if i < ours {
                            Seen::Ours { live: true }
                        } else {
                            match (i - ours) % listed {
                                0 => Seen::Theirs(None),
                                g => Seen::Theirs(Some(TenantId(g as u128))),
                            }
                        }
                    })
                    .collect();
                assert!(
                    matches!(decide(&s, limit, 0), Claim::Reclaim(i) if i >= ours),
                    "listed {listed}, ours {ours}: {:?}",
                    decide(&s, limit, 0)
                );
            }
        }
    }
}
