//! The inventory parsers on `nvidia-smi` outputs captured on real machines
//! (`tests/fixtures/nvidia-smi/`, sources in its README), and the inventory of a GPU node
//! taken through the exec seam from a stand-in `nvidia-smi` that replays those captures.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use pipette::cluster::profile::Source;
use pipette::cluster::Slots;
use pipette::exec::Transport;
use pipette::measure::inventory::{
    datasheet_for, parse_gpu_query, parse_topology, take_inventory, InventoryRequest, LinkClass,
    NodeDevices, Topology,
};

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nvidia-smi")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn classes(topo: &Topology, row: usize) -> Vec<String> {
    (0..topo.gpu_count())
        .map(|j| topo.class(row, j).map_or("X".into(), LinkClass::as_string))
        .collect()
}

/// The DGX-1 hybrid cube-mesh: two NVLinks to some peers, one to others, none across the
/// two quads except the crossing pairs.
const DGX1_ROWS: [&str; 8] = [
    "X NV1 NV1 NV2 NV2 SYS SYS SYS",
    "NV1 X NV2 NV1 SYS NV2 SYS SYS",
    "NV1 NV2 X NV2 SYS SYS NV1 SYS",
    "NV2 NV1 NV2 X SYS SYS SYS NV1",
    "NV2 SYS SYS SYS X NV1 NV1 NV2",
    "SYS NV2 SYS SYS NV1 X NV2 NV1",
    "SYS SYS NV1 SYS NV1 NV2 X NV2",
    "SYS SYS SYS NV1 NV2 NV1 NV2 X",
];

#[test]
fn v100_sxm2_capture_with_ansi_codes() {
    // Captured through a pipe by a collection script: the header is underlined with ANSI
    // escape codes, and a NIC column and the NIC legend follow.
    let text = fixture("v100-sxm2-8x-topo.txt");
    assert!(
        text.contains('\u{1b}'),
        "the capture keeps its escape codes"
    );
    let topo = parse_topology(&text).unwrap();
    assert_eq!(topo.gpu_count(), 8);
    for (i, row) in DGX1_ROWS.iter().enumerate() {
        assert_eq!(classes(&topo, i).join(" "), *row, "GPU{i}");
    }
}

#[test]
fn v100_dgx1_capture_with_mlx5_columns_and_no_numa_column() {
    let topo = parse_topology(&fixture("v100-dgx1-topo.txt")).unwrap();
    assert_eq!(topo.gpu_count(), 8);
    for (i, row) in DGX1_ROWS.iter().enumerate() {
        assert_eq!(classes(&topo, i).join(" "), *row, "GPU{i}");
    }
}

#[test]
fn a100_polaris_capture_with_a_header_without_its_tab() {
    let topo = parse_topology(&fixture("a100-polaris-4x-topo.txt")).unwrap();
    assert_eq!(topo.gpu_count(), 4);
    for i in 0..4 {
        for j in 0..4 {
            let expected = (i != j).then_some(LinkClass::NvLink(4));
            assert_eq!(topo.class(i, j), expected, "GPU{i} to GPU{j}");
        }
    }
}

#[test]
fn h200_hgx_capture_with_ten_nics() {
    let topo = parse_topology(&fixture("h200-hgx-8x-topo.txt")).unwrap();
    assert_eq!(topo.gpu_count(), 8);
    for i in 0..8 {
        assert_eq!(
            classes(&topo, i).iter().filter(|c| *c == "NV18").count(),
            7,
            "GPU{i}: every peer over 18 NVLinks"
        );
    }
}

#[test]
fn v100_query_capture_with_header_and_units() {
    let gpus = parse_gpu_query(&fixture("v100-sxm2-8x-query.csv")).unwrap();
    assert_eq!(gpus.len(), 8);
    assert!(gpus.iter().all(|g| g.name == "Tesla V100-SXM2-32GB"));
    assert_eq!(
        gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    assert_eq!(gpus[0].memory_bytes, 32768 << 20);
    // This machine's GPU 5 really reports 4 MiB less.
    assert_eq!(gpus[5].memory_bytes, 32764 << 20);
    assert!(gpus.iter().all(|g| g.pci_bus_id.is_none()));
    let sheet = datasheet_for(&gpus[0].name).unwrap();
    assert_eq!(sheet.peak.bf16, None, "V100 has no bf16 tensor cores");
    assert_eq!(sheet.peak.fp16, 125.0);
}

/// A stand-in `nvidia-smi` replaying captures, as `nvidia-smi` would print them.
fn fake_nvidia_smi(dir: &Path, query: &str, topo: &str) -> PathBuf {
    std::fs::write(dir.join("query.csv"), fixture(query)).unwrap();
    std::fs::write(dir.join("topo.txt"), fixture(topo)).unwrap();
    let path = dir.join("nvidia-smi");
    common::write_executable(&path, &format!(
            "#!/bin/sh\ncase \"$1\" in\n  --query-gpu=*) cat '{0}/query.csv' ;;\n  topo) cat '{0}/topo.txt' ;;\n  *) exit 2 ;;\nesac\n",
            dir.display()
        ));
    path
}

#[test]
fn gpu_node_inventory_keeps_the_allocated_gpus_and_estimates_their_links() {
    let dir = tempfile::tempdir().unwrap();
    let smi = fake_nvidia_smi(
        dir.path(),
        "v100-sxm2-8x-query.csv",
        "v100-sxm2-8x-topo.txt",
    );
    let smi = smi.to_string_lossy();
    let request = InventoryRequest {
        transport: &Transport::Local,
        nvidia_smi: &smi,
        timeout: Duration::from_secs(20),
    };
    let inv = take_inventory(&request, "gpu07", &Slots::Devices(vec![0, 1, 3, 5])).unwrap();
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    let NodeDevices::Gpus { gpus, topology } = &inv.devices else {
        panic!("{inv:?}")
    };
    assert_eq!(
        gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
        [0, 1, 3, 5]
    );
    assert_eq!(topology.as_ref().unwrap().gpu_count(), 8);
    let links = inv.estimated_gpu_links().unwrap();
    assert_eq!(links.provenance.source, Source::Estimated);
    // GPU0–GPU1: one NVLink 2 (25 GB/s a direction, ~80 % attained); GPU0–GPU3: two;
    // GPU0–GPU5: through the CPUs (PCIe 3).
    assert_eq!(links.get(0, 1), 20.0);
    assert_eq!(links.get(0, 2), 40.0);
    assert!((links.get(0, 3) - 15.75 * 0.4).abs() < 1e-9);

    let err = take_inventory(&request, "gpu07", &Slots::Devices(vec![0, 9])).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("gpu07: GPU 9 is allocated but nvidia-smi does not list it"),
        "{err}"
    );
    let inv = take_inventory(&request, "gpu07", &Slots::Count(2)).unwrap();
    let NodeDevices::Gpus { gpus, .. } = &inv.devices else {
        panic!()
    };
    assert_eq!(gpus.len(), 2);
}

#[test]
fn a_node_without_nvidia_smi_offers_its_cpus() {
    let request = InventoryRequest {
        transport: &Transport::Local,
        nvidia_smi: "/nonexistent/nvidia-smi",
        timeout: Duration::from_secs(20),
    };
    let inv = take_inventory(&request, "node-a", &Slots::Unknown).unwrap();
    let NodeDevices::Cpus {
        memory_bytes, cpus, ..
    } = inv.devices
    else {
        panic!("{inv:?}")
    };
    assert!(memory_bytes > 0 && cpus > 0);
}

#[test]
fn a_broken_driver_is_an_error_not_a_cpu_node() {
    let dir = tempfile::tempdir().unwrap();
    let smi = dir.path().join("nvidia-smi");
    common::write_executable(&smi, "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n");
    let smi = smi.to_string_lossy();
    let request = InventoryRequest {
        transport: &Transport::Local,
        nvidia_smi: &smi,
        timeout: Duration::from_secs(20),
    };
    let err = take_inventory(&request, "gpu07", &Slots::Unknown).unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("gpu07: "), "{text}");
    assert!(
        text.contains("(exit code 9): NVIDIA-SMI has failed"),
        "{text}"
    );
}

/// The NIC listing script run on trees that reproduce a DGX H100 and a GB200 NVL72
/// compute tray (`tests/fixtures/sysfs/`, sources in its README), then counted as NCCL
/// spreads a collective: the compute NICs, never the storage ports, one per GPU at most,
/// and what `NCCL_IB_HCA` admits when it is set.
#[test]
fn nic_counts_of_real_layouts() {
    use pipette::measure::nics::{nccl_nics, parse_ports, LinkLayer, LISTING_SCRIPT};
    let ports = |tree: &str| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sysfs")
            .join(tree);
        let out = std::process::Command::new("sh")
            .args(["-c", LISTING_SCRIPT, "sh"])
            .arg(&root)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        parse_ports(&String::from_utf8(out.stdout).unwrap()).unwrap()
    };
    let dgx = ports("dgx-h100");
    assert_eq!(dgx.len(), 12);
    let ib = dgx
        .iter()
        .filter(|p| p.link_layer == Some(LinkLayer::InfiniBand))
        .count();
    assert_eq!(
        ib, 10,
        "eight compute ports and two InfiniBand storage ports"
    );
    assert_eq!(nccl_nics(&dgx, None, 8), Some(8), "one per GPU");
    let compute = "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11";
    assert_eq!(nccl_nics(&dgx, Some(compute), 8), Some(8));
    assert_eq!(nccl_nics(&dgx, Some("=mlx5_0,mlx5_3"), 8), Some(2));
    assert_eq!(
        nccl_nics(&dgx, Some("^=mlx5_1,mlx5_2,mlx5_7,mlx5_8"), 8),
        Some(8)
    );
    // Without `=` the names are prefixes, as in NCCL: `mlx5_1` excludes mlx5_10 and 11 too.
    assert_eq!(
        nccl_nics(&dgx, Some("^mlx5_1,mlx5_2,mlx5_7,mlx5_8"), 8),
        Some(6)
    );
    assert_eq!(nccl_nics(&dgx, None, 4), Some(4), "--nproc-per-node 4");

    let tray = ports("gb200-tray");
    assert_eq!(tray.len(), 8);
    assert_eq!(
        nccl_nics(&tray, None, 4),
        Some(4),
        "the four ConnectX-7, not the BlueField-3s"
    );
    assert_eq!(
        nccl_nics(&tray, Some("mlx5_2,mlx5_3"), 4),
        Some(2),
        "RoCE when told"
    );

    let empty = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("sh")
        .args(["-c", LISTING_SCRIPT, "sh"])
        .arg(empty.path())
        .output()
        .unwrap();
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
}

/// The NVLink domain from `nvidia-smi -q`'s fabric block, captured on a GB200 tray, and
/// none from a node whose fabric registration failed (zero cluster UUID, clique 0) or
/// from output without a fabric block (an older GPU).
#[test]
fn nvlink_domain_from_the_fabric_block() {
    use pipette::measure::inventory::parse_fabric;
    assert_eq!(
        parse_fabric(&fixture("gb200-fabric-q.txt")).as_deref(),
        Some("dc6e40c4-d722-4357-9ba6-5291dd461278/2")
    );
    assert_eq!(parse_fabric(&fixture("fabric-insufficient-q.txt")), None);
    assert_eq!(parse_fabric(&fixture("v100-sxm2-8x-topo.txt")), None);
}
