//! A [`Reading`] as the Prometheus text exposition format 0.0.4. Names, labels and meanings are
//! listed in docs/OBSERVABILITY.md; labels `gpu` and `UUID` are spelled as dcgm-exporter spells
//! them, so `on(UUID)` joins with `DCGM_FI_DEV_*` work.

use crate::collect::{DeviceReading, Reading, TenantReading};
use crate::gpus::GpuIndex;
use gpuslice_state::config::policy::Kubernetes;
use prometheus::core::Collector;
use prometheus::{
    CounterVec, Encoder, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The `Content-Type` of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const TENANT_GPU: &[&str] = &["tenant", "gpu", "UUID", "namespace", "pod", "container"];
const TENANT: &[&str] = &["tenant", "namespace", "pod", "container"];
const GPU: &[&str] = &["gpu", "UUID"];
const LEDGER: &[&str] = &[
    "kind",
    "ledger",
    "tenant",
    "gpu",
    "UUID",
    "namespace",
    "pod",
    "container",
];

fn gauge(name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    GaugeVec::new(Opts::new(name, help), labels).expect("valid metric definition")
}

fn int_gauge(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric definition")
}

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric definition")
}

/// Counters read from the ledgers are floats only where they are seconds.
fn seconds_counter(name: &str, help: &str, labels: &[&str]) -> CounterVec {
    CounterVec::new(Opts::new(name, help), labels).expect("valid metric definition")
}

fn k8s(k: Option<&Kubernetes>) -> [&str; 3] {
    k.map_or(["", "", ""], |k| {
        [k.namespace.as_str(), k.pod.as_str(), k.container.as_str()]
    })
}

/// Every metric family of one scrape.
struct Families {
    limit: GaugeVec,
    used: IntGaugeVec,
    peak: IntGaugeVec,
    denied: IntCounterVec,
    exited: IntGaugeVec,
    processes: IntGaugeVec,
    share: GaugeVec,
    cap: GaugeVec,
    busy: CounterVec,
    wait: CounterVec,
    handovers: IntCounterVec,
    revocations: IntCounterVec,
    tenant_handovers: IntCounterVec,
    tenant_revocations: IntCounterVec,
    valid: IntGaugeVec,
    also: IntGaugeVec,
    unhealthy: IntGaugeVec,
    free_slots: IntGaugeVec,
    squatted: IntGaugeVec,
    size_wrong: IntGaugeVec,
    forged_owner: IntCounterVec,
    slot_denials: IntCounterVec,
    slot_reclaims: IntCounterVec,
    lock_takeovers: IntCounterVec,
    size_repairs: IntCounterVec,
    build: IntGaugeVec,
}

impl Families {
    fn new() -> Families {
        Families {
            limit: gauge(
                "gpuslice_memory_limit_bytes",
                "Device-memory quota of the tenant on the GPU (absent: unlimited).",
                TENANT_GPU,
            ),
            used: int_gauge(
                "gpuslice_memory_used_bytes",
                "Device memory the tenant's processes hold on the GPU, as charged to its quota.",
                TENANT_GPU,
            ),
            peak: int_gauge(
                "gpuslice_memory_peak_bytes",
                "Highest gpuslice_memory_used_bytes since the tenant's ledger was created.",
                TENANT_GPU,
            ),
            denied: counter(
                "gpuslice_memory_allocation_denied_total",
                "Reservations refused at the tenant's quota on the GPU (CUDA_ERROR_OUT_OF_MEMORY to the program).",
                TENANT_GPU,
            ),
            exited: int_gauge(
                "gpuslice_memory_exited_bytes",
                "Part of gpuslice_memory_used_bytes still charged to processes that have exited (given back when a process of the tenant next starts).",
                TENANT_GPU,
            ),
            processes: int_gauge(
                "gpuslice_tenant_processes",
                "Live processes attached to the tenant's ledger.",
                TENANT,
            ),
            share: gauge(
                "gpuslice_compute_share_ratio",
                "Compute share promised to the tenant on the GPU under contention (0-1).",
                TENANT_GPU,
            ),
            cap: gauge(
                "gpuslice_compute_limit_ratio",
                "Compute cap of the tenant on the GPU (0-1; 1: no cap).",
                TENANT_GPU,
            ),
            busy: seconds_counter(
                "gpuslice_compute_busy_seconds_total",
                "GPU time charged to the tenant; rate() is its achieved share of the GPU.",
                TENANT_GPU,
            ),
            wait: seconds_counter(
                "gpuslice_compute_wait_seconds_total",
                "Time the tenant's launches waited for the GPU, summed over its processes.",
                TENANT_GPU,
            ),
            handovers: counter(
                "gpuslice_compute_handovers_total",
                "Changes of the GPU's owner among tenants.",
                GPU,
            ),
            revocations: counter(
                "gpuslice_compute_revocations_total",
                "Ownerships of the GPU taken back from a holder that died or stopped.",
                GPU,
            ),
            tenant_handovers: counter(
                "gpuslice_compute_tenant_handovers_total",
                "Ownerships of the GPU granted to the tenant's processes (absent: the GPU keeps no per-tenant counters).",
                TENANT_GPU,
            ),
            tenant_revocations: counter(
                "gpuslice_compute_tenant_revocations_total",
                "Ownerships of the GPU taken back from a process of the tenant that died or stopped (absent: no per-tenant counters).",
                TENANT_GPU,
            ),
            valid: int_gauge(
                "gpuslice_ledger_valid",
                "1: the ledger was read; 0: it exists but cannot be read as a ledger (corrupt, wrong version, unreadable).",
                LEDGER,
            ),
            also: int_gauge(
                "gpuslice_gpu_also_allocated",
                "1: the GPU, offered in slices by the device plugin, is also allocated whole through nvidia.com/gpu to this pod (handed out twice).",
                &["gpu", "UUID", "namespace", "pod", "container"],
            ),
            unhealthy: int_gauge(
                "gpuslice_device_ledger_unhealthy",
                "1: the GPU's device ledger has free process slots locked by someone not in them (gpuslice_device_ledger_squatted_slots), none free, the wrong size, or cannot be read: gpuslice status --compute says which. 0: healthy.",
                GPU,
            ),
            free_slots: int_gauge(
                "gpuslice_device_ledger_free_slots",
                "Process slots of the GPU's device ledger free to claim (its lock held by nobody); at 0 a process starting on the GPU whose tenant has no memory ledger runs throttled to its share.",
                GPU,
            ),
            squatted: int_gauge(
                "gpuslice_device_ledger_squatted_slots",
                "Free process slots of the GPU's device ledger whose lock is held by someone not in them (kernel evidence: an fcntl lock), a tenant squatting them. Processes whose tenant has a memory ledger still claim them; others cannot.",
                GPU,
            ),
            size_wrong: int_gauge(
                "gpuslice_device_ledger_size_wrong",
                "1: the GPU's device ledger is not its layout's size now (grown or shrunk; the next process that joins, or tenant create, repairs it). 0: the right size.",
                GPU,
            ),
            forged_owner: counter(
                "gpuslice_compute_forged_owner_total",
                "Times a process on the GPU found itself kept from its due by an owner whose ledger words lie (forged ownership) and launched paced to its share. Counted in the device ledger, which every tenant of the GPU can write: a report, not evidence.",
                GPU,
            ),
            slot_denials: counter(
                "gpuslice_compute_slot_denials_total",
                "Processes that found no process slot in the GPU's device ledger and ran throttled to their share. Counted in the device ledger (tenant-writable: a report).",
                GPU,
            ),
            slot_reclaims: counter(
                "gpuslice_compute_slot_reclaims_total",
                "Process slots taken back from a tenant holding more than its limit (its part of the slots by the node's policy) by a process that found every slot of the GPU's device ledger in use. Counted in the device ledger (tenant-writable: a report).",
                GPU,
            ),
            lock_takeovers: counter(
                "gpuslice_compute_lock_takeovers_total",
                "Times a process took the GPU's arbitration lock over from a holder that kept it past its bound. Counted in the device ledger (tenant-writable: a report).",
                GPU,
            ),
            size_repairs: counter(
                "gpuslice_device_ledger_size_repairs_total",
                "Times the GPU's device ledger was found grown, shrunk or damaged and repaired in place. Counted in the device ledger (tenant-writable: a report).",
                GPU,
            ),
            build: int_gauge(
                "gpuslice_build_info",
                "Version of the exporter, and the ledger layout version it reads.",
                &["version", "ledger_layout"],
            ),
        }
    }

    fn tenant(&self, t: &TenantReading, gpus: &mut GpuIndex) {
        let [ns, pod, container] = k8s(t.kubernetes.as_ref());
        let ledger = t.ledger.display().to_string();
        self.valid
            .with_label_values(&["tenant", &ledger, &t.tenant, "", "", ns, pod, container])
            .set(t.memory.is_ok() as i64);
        let Ok(m) = &t.memory else { return };
        self.processes
            .with_label_values(&[&t.tenant, ns, pod, container])
            .set(m.processes as i64);
        for d in &m.devices {
            let gpu = gpus.label(&d.uuid);
            let l = [t.tenant.as_str(), &gpu, &d.uuid, ns, pod, container];
            if let Some(bytes) = d.limit {
                self.limit.with_label_values(&l).set(bytes as f64);
            }
            self.used.with_label_values(&l).set(clamp(d.used));
            self.peak.with_label_values(&l).set(clamp(d.peak));
            self.denied.with_label_values(&l).inc_by(d.denied);
            self.exited.with_label_values(&l).set(clamp(d.exited));
        }
    }

    fn device(&self, d: &DeviceReading, reading: &Reading, gpus: &mut GpuIndex) {
        let gpu = gpus.label(&d.uuid);
        let ledger = d.ledger.display().to_string();
        self.valid
            .with_label_values(&["device", &ledger, "", &gpu, &d.uuid, "", "", ""])
            .set(d.compute.is_ok() as i64);
        self.unhealthy
            .with_label_values(&[&gpu, &d.uuid])
            .set(d.unhealthy as i64);
        if let Some(wrong) = d.size_wrong {
            self.size_wrong
                .with_label_values(&[&gpu, &d.uuid])
                .set(wrong as i64);
        }
        if let Some(h) = &d.health {
            let l = [gpu.as_str(), &d.uuid];
            self.free_slots
                .with_label_values(&l)
                .set(h.free_slots as i64);
            self.squatted
                .with_label_values(&l)
                .set(h.squatted_slots as i64);
            self.forged_owner
                .with_label_values(&l)
                .inc_by(h.forged_owner);
            self.slot_denials
                .with_label_values(&l)
                .inc_by(h.slot_denials);
            self.slot_reclaims
                .with_label_values(&l)
                .inc_by(h.slot_reclaims);
            self.lock_takeovers
                .with_label_values(&l)
                .inc_by(h.lock_takeovers);
            self.size_repairs
                .with_label_values(&l)
                .inc_by(h.size_repairs);
        }
        let Ok(c) = &d.compute else { return };
        self.handovers
            .with_label_values(&[&gpu, &d.uuid])
            .inc_by(c.handovers);
        self.revocations
            .with_label_values(&[&gpu, &d.uuid])
            .inc_by(c.revocations);
        for t in &c.tenants {
            let [ns, pod, container] = k8s(reading.owner(&t.tenant));
            let l = [t.tenant.as_str(), &gpu, &d.uuid, ns, pod, container];
            self.share
                .with_label_values(&l)
                .set(f64::from(t.share) / 100.0);
            self.cap.with_label_values(&l).set(match t.cap {
                0 => 1.0,
                c => f64::from(c) / 100.0,
            });
            self.busy
                .with_label_values(&l)
                .inc_by(t.busy_ns as f64 / 1e9);
            self.wait
                .with_label_values(&l)
                .inc_by(t.wait_ns as f64 / 1e9);
            if let (Some(h), Some(r)) = (t.handovers, t.revocations) {
                self.tenant_handovers.with_label_values(&l).inc_by(h);
                self.tenant_revocations.with_label_values(&l).inc_by(r);
            }
        }
    }

    fn registry(self) -> Registry {
        let registry = Registry::new();
        let all: [Box<dyn Collector>; 26] = [
            Box::new(self.limit),
            Box::new(self.used),
            Box::new(self.peak),
            Box::new(self.denied),
            Box::new(self.exited),
            Box::new(self.processes),
            Box::new(self.share),
            Box::new(self.cap),
            Box::new(self.busy),
            Box::new(self.wait),
            Box::new(self.handovers),
            Box::new(self.revocations),
            Box::new(self.tenant_handovers),
            Box::new(self.tenant_revocations),
            Box::new(self.valid),
            Box::new(self.also),
            Box::new(self.unhealthy),
            Box::new(self.free_slots),
            Box::new(self.squatted),
            Box::new(self.size_wrong),
            Box::new(self.forged_owner),
            Box::new(self.slot_denials),
            Box::new(self.slot_reclaims),
            Box::new(self.lock_takeovers),
            Box::new(self.size_repairs),
            Box::new(self.build),
        ];
        for c in all {
            registry.register(c).expect("distinct metric names");
        }
        registry
    }
}

fn clamp(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// The exposition text of `reading`.
pub fn encode(reading: &Reading, gpus: &mut GpuIndex) -> String {
    let f = Families::new();
    f.build
        .with_label_values(&[
            env!("CARGO_PKG_VERSION"),
            &gpuslice_state::ledger::LAYOUT_VERSION.to_string(),
        ])
        .set(1);
    for t in &reading.tenants {
        f.tenant(t, gpus);
    }
    for d in &reading.devices {
        f.device(d, reading, gpus);
    }
    for (uuid, k) in &reading.also_allocated {
        let gpu = gpus.label(uuid);
        f.also
            .with_label_values(&[&gpu, uuid, &k.namespace, &k.pod, &k.container])
            .set(1);
    }
    let mut out = Vec::new();
    // Encoding into a Vec fails only on invalid metric families, which the definitions above rule out.
    let _ = TextEncoder::new().encode(&f.registry().gather(), &mut out);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let unmanaged = crate::procs::encode_unmanaged(reading.unmanaged.as_ref(), now, gpus);
    String::from_utf8(out).unwrap_or_default() + &unmanaged
}
