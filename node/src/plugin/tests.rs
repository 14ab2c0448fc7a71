use super::kubelet::conflicts_of;
use super::*;
use crate::policy::Kubernetes;

#[test]
fn packs_onto_few_gpus() {
    let ids =
        |g: &str, r: std::ops::Range<u32>| -> Vec<String> { r.map(|i| device_id(g, i)).collect() };
    let mut avail = ids("GPU-a", 0..4);
    avail.extend(ids("GPU-b", 0..10));
    // 3 fit on GPU-a (the tighter fit), leaving GPU-b whole.
    assert_eq!(preferred(&avail, &[], 3), ids("GPU-a", 0..3));
    // 6 fit only on GPU-b.
    assert_eq!(preferred(&avail, &[], 6), ids("GPU-b", 0..6));
    // 12: all of GPU-b, then 2 of GPU-a.
    let got = preferred(&avail, &[], 12);
    assert_eq!(got.len(), 12);
    assert_eq!(got.iter().filter(|d| d.starts_with("GPU-b")).count(), 10);
    // A must-include slice pulls the rest onto its GPU.
    let must = vec![device_id("GPU-b", 5)];
    let got = preferred(&avail, &must, 3);
    assert_eq!(
        got,
        vec![
            device_id("GPU-b", 5),
            device_id("GPU-b", 0),
            device_id("GPU-b", 1)
        ]
    );
}

#[test]
fn slice_memory_rounds_down_to_2_mib() {
    assert_eq!(slice_memory(16 << 30, 3, 10), 2457 * (2 << 20));
    assert_eq!(slice_memory(16 << 30, 10, 10), 16 << 30);
    assert_eq!(slice_memory(1 << 20, 1, 10), 0);
}

#[test]
fn slices_by_memory_are_the_same_on_every_gpu() {
    let s = Slicing::Memory(4 << 30);
    assert_eq!(s.per_gpu(8 << 30), 2);
    assert_eq!(s.per_gpu(16 << 30), 4);
    assert_eq!(s.per_gpu(3 << 30), 0);
    assert_eq!(s.memory(8 << 30, 1), 4 << 30);
    assert_eq!(s.memory(16 << 30, 3), 12 << 30);
    assert_eq!(s.share(8 << 30, 1), 50);
    assert_eq!(s.share(16 << 30, 1), 25);
    assert_eq!(s.share(16 << 30, 3), 75);
    let n = Slicing::Count(10);
    assert_eq!(n.per_gpu(80 << 30), 10);
    assert_eq!(n.share(80 << 30, 3), 30);
    assert_eq!(n.memory(16 << 30, 3), slice_memory(16 << 30, 3, 10));
}

#[test]
fn gpus_held_through_nvidia_are_found_by_uuid_or_index() {
    let gpu = |index: u32, uuid: &str| Offered {
        gpu: Gpu {
            index,
            mig: None,
            uuid: uuid.into(),
            name: "sim".into(),
            memory: 16 << 30,
            healthy: true,
        },
        slices: 10,
    };
    let gpus = [gpu(0, "GPU-a"), gpu(1, "GPU-b")];
    let who = Kubernetes {
        namespace: "ml".into(),
        pod: "p".into(),
        container: "c".into(),
    };
    let got = conflicts_of(
        &gpus,
        &[
            ("GPU-b".into(), who.clone()),
            ("GPU-z".into(), who.clone()),
            ("0".into(), who.clone()),
        ],
    );
    assert_eq!(got.keys().collect::<Vec<_>>(), ["GPU-a", "GPU-b"]);
}
