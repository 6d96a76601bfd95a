//! The cluster profile file: nodes, their GPUs, the attained bandwidth of every link that
//! matters, and where each figure came from.
//!
//! Owns the `pipette-cluster/1` schema (see `docs/cluster-profile.md`):
//!
//! - `types`: the profile ([`ClusterProfile`] and its parts) and the file's shape, read
//!   and written by serde derive; selecting the part of a profile an allocation uses, and
//!   filling in default GPUs for profiles imported from tools that measured the network only;
//! - `read`: JSON to a profile, in any format [`ClusterProfile::load`] knows (the foreign
//!   ones are handed to [`super::import`]), with messages that name the file, the JSON path
//!   of the bad field and what to do;
//! - `validate`: the one validation pass, strict with figures people write and lenient
//!   with figures the probe measured;
//! - `write`: the stable, diff-friendly layout;
//! - `slow`: measured figures far below their peers, for people and the profile's notes.
//!
//! Must not know how figures are measured (that is the profiler's job) nor what a plan does
//! with them. Never panics on input: every problem is a [`ProfileError`].

mod error;
mod read;
mod slow;
mod types;
mod validate;
mod write;

pub use error::ProfileError;
pub use slow::SlowPart;
pub use types::{
    round_figure, AllRails, AttentionFigure, AttentionShape, ClusterProfile, CollectiveFigure,
    DeviceSelection, Dtype, GemmFigure, GemmLayout, GemmShape, GpuInventory, GpuSpec, LinkMatrix,
    MeasuredPerf, MeasuredTflops, NodeProfile, NodeSelection, PeakTflops, Provenance, Source,
};

pub(crate) use error::{count, field_path, index_path, invalid, quote, show_number, wrong_type};
pub(crate) use read::{deserialize, Format};
pub(crate) use slow::median;
pub(crate) use validate::{bandwidth_cells, check_hosts, Check, MatrixShape, Unit};

/// The version tag every profile file starts with.
pub const SCHEMA_VERSION: &str = "pipette-cluster/1";

/// No link attains more than this (GB/s); a larger figure is a unit mistake (MB/s read as GB/s).
/// NVLink 5 moves 900 GB/s per direction per GPU, so this leaves room for a decade of growth.
pub const MAX_PLAUSIBLE_GB_PER_S: f64 = 10_000.0;

/// Every working link attains more than this (GB/s, i.e. 1 MB/s); a smaller figure written
/// by hand is a unit mistake or a broken link. A measured one is kept, and flagged as slow.
pub const MIN_PLAUSIBLE_GB_PER_S: f64 = 0.001;

/// Accepted peak and measured TFLOPS lie between these, for figures written by hand; a
/// measured figure below the floor is kept, and flagged as slow.
pub const TFLOPS_RANGE: (f64, f64) = (0.001, 100_000.0);

/// The least bandwidth a measurement can give, GB/s (one byte per second): the probe's
/// smallest message (64 KiB) would take 18 hours, far past its time limit. A measured figure
/// below it is not a slow link but a broken measurement.
pub const MIN_MEASURABLE_GB_PER_S: f64 = 1e-9;

/// The least throughput a measurement can give, TFLOPS (one operation per second), for the
/// same reason.
pub const MIN_MEASURABLE_TFLOPS: f64 = 1e-12;

/// Figures are kept to this many significant digits (far below measurement noise), so that
/// they are written in at most that many digits and read back as the very same `f64` by
/// serde_json, which without its `float_roundtrip` feature may misread 17-digit numbers.
pub const SIGNIFICANT_DIGITS: usize = 12;

/// The most GPUs [`ClusterProfile::with_default_gpus`] puts on one node.
pub const MAX_GPUS_PER_NODE: usize = 256;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An A100-SXM4-80GB at its datasheet peaks: the GPU of most profile tests.
    pub(crate) fn a100(index: u32) -> GpuSpec {
        GpuSpec {
            index,
            name: "A100-SXM4-80GB".into(),
            memory_bytes: 85_899_345_920,
            peak_tflops: PeakTflops::new(Some(312.0), 312.0),
            measured_tflops: Vec::new(),
            provenance: Provenance::new(Source::Datasheet),
        }
    }

    /// Two nodes of two A100s each.
    pub(crate) fn two_nodes() -> ClusterProfile {
        let gpus = GpuInventory::Known {
            gpus: vec![a100(0), a100(1)],
            links: LinkMatrix::uniform(2, 240.0, Provenance::new(Source::Estimated)),
        };
        ClusterProfile {
            measured_perf: Vec::new(),
            note: Some("two nodes".into()),
            nodes: vec![
                NodeProfile {
                    host: "n0".into(),
                    gpus: gpus.clone(),
                    nvlink_domain: None,
                },
                NodeProfile {
                    host: "n1".into(),
                    gpus,
                    nvlink_domain: None,
                },
            ],
            node_links: LinkMatrix::from_rows(
                &[vec![0.0, 23.5], vec![23.25, 0.0]],
                Provenance::new(Source::Measured)
                    .with_date("2024-05-31")
                    .with_tool("nccl-tests"),
            )
            .unwrap(),
        }
    }

    #[test]
    fn link_matrix_reads_by_sender_then_receiver() {
        let m = LinkMatrix::from_rows(
            &[
                vec![9.0, 1.0, 2.0],
                vec![3.0, 9.0, 4.0],
                vec![5.0, 6.0, 9.0],
            ],
            Provenance::new(Source::Measured),
        )
        .unwrap();
        assert_eq!(m.size(), 3);
        assert_eq!(m.get(0, 1), 1.0);
        assert_eq!(m.get(1, 0), 3.0);
        assert_eq!(m.get(2, 2), 0.0, "the diagonal is set to 0");
        assert_eq!(m.row(1), &[3.0, 0.0, 4.0]);
        assert_eq!(m.min_link(), Some(1.0));
        assert_eq!(m.max_link(), Some(6.0));
        assert_eq!(m.links().count(), 6);
        assert!(
            LinkMatrix::from_rows(&[vec![1.0, 2.0]], Provenance::new(Source::Measured)).is_none()
        );
    }

    #[test]
    fn link_matrix_set_ignores_the_diagonal() {
        let mut m = LinkMatrix::uniform(2, 10.0, Provenance::new(Source::Estimated));
        m.set(0, 1, 12.5);
        m.set(1, 1, 99.0);
        assert_eq!(m.get(0, 1), 12.5);
        assert_eq!(m.get(1, 1), 0.0);
        assert_eq!(
            LinkMatrix::uniform(1, 5.0, Provenance::new(Source::Estimated)).min_link(),
            None
        );
    }

    /// Ring pairs (i, i + 1) both ways at 20 GB/s, node 2's links at 2 GB/s.
    fn sampled(n: usize) -> LinkMatrix {
        let slow = |a: usize, b: usize| if a == 2 || b == 2 { 2.0 } else { 20.0 };
        let pairs = (0..n)
            .flat_map(|i| {
                let j = (i + 1) % n;
                [(i, j, slow(i, j)), (j, i, slow(i, j))]
            })
            .collect();
        let mut per_node = vec![20.0; n];
        per_node[2] = 2.0;
        LinkMatrix::sampled(per_node, pairs, Provenance::new(Source::Measured)).unwrap()
    }

    fn unknown_nodes(n: usize) -> Vec<NodeProfile> {
        (0..n)
            .map(|i| NodeProfile {
                host: format!("n{i}"),
                gpus: GpuInventory::Unknown,
                nvlink_domain: None,
            })
            .collect()
    }

    #[test]
    fn a_sampled_matrix_answers_every_pair_from_linear_figures() {
        let m = sampled(6);
        assert!(m.is_sampled());
        assert_eq!(m.size(), 6);
        assert_eq!(
            m.stored_figures(),
            6 + 12,
            "a figure per node and the measured pairs"
        );
        assert_eq!(m.get(0, 1), 20.0, "measured");
        assert_eq!(m.get(3, 2), 2.0, "measured, slow node");
        assert_eq!(m.get(0, 3), 20.0, "unmeasured: the lesser node figure");
        assert_eq!(m.get(5, 2), 2.0, "unmeasured, to the slow node");
        assert_eq!(m.get(4, 4), 0.0);
        assert_eq!(m.links().count(), 12);
        assert_eq!((m.min_link(), m.max_link()), (Some(2.0), Some(20.0)));
        assert_eq!(m.row(2), [2.0, 2.0, 0.0, 2.0, 2.0, 2.0]);

        let mut set = m.clone();
        set.set(0, 3, 7.5);
        set.set(0, 0, 9.0);
        assert_eq!(
            (set.get(0, 3), set.get(3, 0), set.get(0, 0)),
            (7.5, 20.0, 0.0)
        );
        assert_eq!(
            set.get(1, 2),
            2.0,
            "the rows after the new pair still read right"
        );
        assert_eq!(set.links().count(), 13);

        // Rows and columns follow the selection; pairs between chosen nodes are kept.
        let picked = m.select(&[3, 2, 0]);
        assert!(picked.is_sampled());
        assert_eq!(picked.per_endpoint(), Some(&[20.0, 2.0, 20.0][..]));
        assert_eq!(picked.links().count(), 2, "only 3-2 and 2-3 were measured");
        assert_eq!((picked.get(0, 1), picked.get(0, 2)), (2.0, 20.0));

        assert!(LinkMatrix::sampled(vec![1.0], vec![(0, 1, 1.0)], m.provenance.clone()).is_none());
    }

    #[test]
    fn a_full_matrix_selects_as_before() {
        let m = LinkMatrix::from_rows(
            &[
                vec![0.0, 1.0, 2.0],
                vec![3.0, 0.0, 4.0],
                vec![5.0, 6.0, 0.0],
            ],
            Provenance::new(Source::Measured),
        )
        .unwrap()
        .with_nics_per_node(Some(2));
        let picked = m.select(&[2, 0]);
        assert!(!picked.is_sampled());
        assert_eq!(picked.row(0), [0.0, 5.0]);
        assert_eq!(picked.row(1), [2.0, 0.0]);
        assert_eq!(picked.nics_per_node, Some(2));
        assert_eq!(m.stored_figures(), 9);
    }

    #[test]
    fn sampled_node_links_are_written_and_read_back() {
        let mut profile = two_nodes();
        profile.nodes = unknown_nodes(6);
        profile.node_links = sampled(6).with_nics_per_node(Some(4));
        let text = profile.to_json_pretty();
        assert!(
            text.starts_with("{\n  \"schema\": \"pipette-cluster/1\",\n"),
            "{text}"
        );
        assert!(
            text.contains("\"node_gb_per_s\": [20.0, 20.0, 2.0, 20.0, 20.0, 20.0]"),
            "{text}"
        );
        assert!(text.contains("\n      [0, 1, 20.0],\n"), "{text}");
        assert!(!text.contains("\"gb_per_s\""), "{text}");
        let again = ClusterProfile::from_json_str(&text, "t.json").unwrap();
        assert_eq!(again, profile);
        assert_eq!(again.subset(&[]).unwrap().nodes.len(), 0);
    }

    #[test]
    fn sampled_node_links_are_checked_with_their_paths() {
        let mut profile = two_nodes();
        profile.nodes = unknown_nodes(3);
        profile.node_links = sampled(3);
        let text = profile.to_json_pretty();
        let error = |from: &str, to: &str| {
            assert!(text.contains(from), "{from} not in {text}");
            ClusterProfile::from_json_str(&text.replacen(from, to, 1), "s.json")
                .unwrap_err()
                .to_string()
        };
        let cases = [
            ("[0, 1, 20.0]", "[0, 1, -1.0]", "s.json: node_links.pairs[0][2] is -1"),
            ("[0, 1, 20.0]", "[0, 7, 20.0]", "s.json: node_links.pairs[0] names node 7, but there are 3 nodes"),
            ("[0, 1, 20.0]", "[1, 1, 20.0]", "s.json: node_links.pairs[0] is a node paired with itself"),
            ("[0, 1, 20.0]", "[0, 2, 2.0]", "s.json: node_links.pairs[1] repeats the pair from \"n0\" to \"n2\", already at node_links.pairs[0]"),
            ("[0, 1, 20.0]", "[0, 1]", "s.json: node_links.pairs[0] is"),
            ("[20.0, 20.0, 2.0]", "[20.0, 2.0]", "s.json: node_links.node_gb_per_s has 2 figures but there are 3 nodes"),
            ("[20.0, 20.0, 2.0]", "[20.0, 0.0, 2.0]", "s.json: node_links.node_gb_per_s[1] is 0"),
            ("\"node_gb_per_s\"", "\"gb_per_s\": [], \"node_gb_per_s\"", "s.json: node_links.gb_per_s is given beside node_gb_per_s or pairs"),
            ("\"node_gb_per_s\": [20.0, 20.0, 2.0],", "", "s.json: node_links.node_gb_per_s is missing"),
        ];
        for (from, to, want) in cases {
            let err = error(from, to);
            assert!(err.starts_with(want), "{from} -> {to}: {err}");
        }
    }

    #[test]
    fn pretty_output_reads_back_equal() {
        let profile = two_nodes();
        let text = profile.to_json_pretty();
        assert!(
            text.starts_with("{\n  \"schema\": \"pipette-cluster/1\",\n"),
            "{text}"
        );
        assert!(text.ends_with("}\n"));
        let again = ClusterProfile::from_json_str(&text, "t.json").unwrap();
        assert_eq!(again, profile);
        // serde goes through the same reader.
        let json = serde_json::to_string(&profile).unwrap();
        let back: ClusterProfile = serde_json::from_str(&json).unwrap();
        assert_eq!(back, profile);
    }

    #[test]
    fn fp8_and_fp4_peaks_read_back_and_are_left_out_when_unknown() {
        let profile = two_nodes();
        let text = profile.to_json_pretty();
        assert!(!text.contains("\"fp8\""), "no FP8 figure, no key: {text}");
        let with = text.replace(
            "\"fp16\": 312.0",
            "\"fp16\": 312.0, \"fp8\": 1979.0, \"fp4\": 9000.0",
        );
        let again = ClusterProfile::from_json_str(&with, "f.json").unwrap();
        let peak = again.nodes[0].gpus().unwrap()[0].peak_tflops;
        assert_eq!((peak.fp8, peak.fp4), (Some(1979.0), Some(9000.0)));
        assert!(again.to_json_pretty().contains("\"fp8\": 1979.0"));
        let bad = text.replace("\"fp16\": 312.0", "\"fp16\": 312.0, \"fp8\": -1.0");
        let err = ClusterProfile::from_json_str(&bad, "b.json").unwrap_err();
        assert!(err.to_string().contains("peak_tflops.fp8 is -1"), "{err}");
    }

    #[test]
    fn nvlink_domains_read_back_and_are_left_out_when_none() {
        let mut profile = two_nodes();
        assert!(!profile.to_json_pretty().contains("nvlink_domain"));
        profile.nodes[0].nvlink_domain = Some("rack-0".into());
        let text = profile.to_json_pretty();
        assert!(text.contains("\"nvlink_domain\": \"rack-0\""), "{text}");
        assert_eq!(
            ClusterProfile::from_json_str(&text, "d.json").unwrap(),
            profile
        );
        let picked = profile
            .subset(&[NodeSelection {
                host: "n0",
                devices: DeviceSelection::All,
            }])
            .unwrap();
        assert_eq!(picked.nodes[0].nvlink_domain.as_deref(), Some("rack-0"));
    }

    #[test]
    fn nics_per_node_reads_back_and_belongs_to_node_links() {
        let mut profile = two_nodes();
        profile.node_links.nics_per_node = Some(4);
        let text = profile.to_json_pretty();
        assert!(text.contains("\"nics_per_node\": 4"), "{text}");
        let again = ClusterProfile::from_json_str(&text, "t.json").unwrap();
        assert_eq!(again.node_links.nics_per_node, Some(4));
        assert_eq!(again, profile);

        let zero = text.replace("\"nics_per_node\": 4", "\"nics_per_node\": 0");
        let err = ClusterProfile::from_json_str(&zero, "z.json").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("z.json: node_links.nics_per_node is 0"),
            "{err}"
        );
        let misplaced = text.replacen("\"gb_per_s\"", "\"nics_per_node\": 2, \"gb_per_s\"", 1);
        let err = ClusterProfile::from_json_str(&misplaced, "m.json").unwrap_err();
        assert!(
            err.to_string()
                .contains("gpu_links.nics_per_node belongs to node_links only"),
            "{err}"
        );
    }

    /// Issue 30: `node_links.all_rails` is optional (a profile without it reads as before),
    /// reads back, and is checked with its path: node links only, at least one rail,
    /// figures above 0.
    #[test]
    fn all_rails_reads_back_and_is_checked() {
        let mut profile = two_nodes();
        profile.node_links.nics_per_node = Some(4);
        profile.node_links.set_all_rails(Some(AllRails {
            rails: 4,
            gb_per_s: 150.0,
            one_rail_gb_per_s: 48.5,
        }));
        let text = profile.to_json_pretty();
        let written = r#""all_rails": {"rails": 4, "gb_per_s": 150.0, "one_rail_gb_per_s": 48.5}"#;
        assert!(text.contains(written), "{text}");
        let again = ClusterProfile::from_json_str(&text, "t.json").unwrap();
        assert_eq!(again, profile);
        let without =
            ClusterProfile::from_json_str(&text.replace(&format!("{written},"), ""), "w.json")
                .unwrap();
        assert_eq!(without.node_links.all_rails(), None);

        let refused = |from: &str, to: &str| {
            ClusterProfile::from_json_str(&text.replace(from, to), "r.json")
                .unwrap_err()
                .to_string()
        };
        let err = refused("\"rails\": 4", "\"rails\": 0");
        assert!(
            err.starts_with("r.json: node_links.all_rails.rails is 0"),
            "{err}"
        );
        let err = refused("\"gb_per_s\": 150.0", "\"gb_per_s\": 0.0");
        assert!(
            err.starts_with("r.json: node_links.all_rails.gb_per_s is 0"),
            "{err}"
        );
        let err = refused("\"one_rail_gb_per_s\": 48.5", "\"one_rail_gb_per_s\": -1");
        assert!(
            err.starts_with("r.json: node_links.all_rails.one_rail_gb_per_s is -1"),
            "{err}"
        );
        let err = refused("\"one_rail_gb_per_s\"", "\"one_gb_per_s\"");
        assert!(err.contains("one_gb_per_s"), "{err}");
        let misplaced = text.replacen("\"gb_per_s\"", &format!("{written}, \"gb_per_s\""), 1);
        let err = ClusterProfile::from_json_str(&misplaced, "m.json").unwrap_err();
        assert!(
            err.to_string()
                .contains("gpu_links.all_rails belongs to node_links only"),
            "{err}"
        );
    }

    #[test]
    fn pretty_output_puts_one_matrix_row_on_a_line() {
        let mut profile = two_nodes();
        profile.node_links = LinkMatrix::uniform(12, 23.5, Provenance::new(Source::Estimated));
        profile.nodes = (0..12)
            .map(|i| NodeProfile {
                host: format!("n{i}"),
                gpus: GpuInventory::Unknown,
                nvlink_domain: None,
            })
            .collect();
        let text = profile.to_json_pretty();
        let row_lines = text
            .lines()
            .filter(|l| {
                l.trim_start().starts_with("[0.0, 23.5") || l.trim_start().starts_with("[23.5")
            })
            .count();
        assert_eq!(row_lines, 12, "{text}");
        assert!(
            text.contains("    {\"host\": \"n0\", \"gpus\": \"unknown\"},\n"),
            "{text}"
        );
        assert!(!text.contains("\"bf16\""));
    }

    #[test]
    fn validate_names_the_field() {
        let mut profile = two_nodes();
        if let GpuInventory::Known { gpus, .. } = &mut profile.nodes[1].gpus {
            gpus[1].memory_bytes = 0;
        }
        let err = profile.validate("mem.json").unwrap_err().to_string();
        assert!(
            err.starts_with("mem.json: nodes[1].gpus[1].memory_bytes is 0 bytes"),
            "{err}"
        );

        let mut profile = two_nodes();
        profile.node_links.set(1, 0, f64::NAN);
        let err = profile.validate("nan.json").unwrap_err().to_string();
        assert!(
            err.contains("node_links.gb_per_s[1][0] is NaN, not a finite number"),
            "{err}"
        );
    }

    #[test]
    fn default_gpus_fill_unknown_nodes_only() {
        let mut profile = two_nodes();
        profile.nodes[1].gpus = GpuInventory::Unknown;
        assert!(!profile.gpus_known());
        assert_eq!(profile.gpu_count(), None);
        let filled = profile.with_default_gpus(a100(7), 4, 200.0).unwrap();
        assert!(filled.gpus_known());
        assert_eq!(filled.gpu_count(), Some(6));
        assert_eq!(
            filled.nodes[0].gpus().unwrap().len(),
            2,
            "known nodes are kept"
        );
        let gpus = filled.nodes[1].gpus().unwrap();
        assert_eq!(
            gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        let links = filled.nodes[1].gpu_links().unwrap();
        assert_eq!(links.get(0, 3), 200.0);
        assert_eq!(links.provenance.source, Source::Estimated);
        filled.validate("filled").unwrap();
    }

    #[test]
    fn default_gpus_reject_nonsense() {
        let profile = two_nodes();
        let err = profile
            .clone()
            .with_default_gpus(a100(0), 0, 200.0)
            .unwrap_err();
        assert!(err.to_string().contains("per_node is 0"), "{err}");
        let err = profile
            .clone()
            .with_default_gpus(a100(0), 8, -1.0)
            .unwrap_err();
        assert!(
            err.to_string().contains("intra_node_gb_per_s is -1"),
            "{err}"
        );
        let mut bad = a100(0);
        bad.memory_bytes = 0;
        let err = profile.with_default_gpus(bad, 8, 200.0).unwrap_err();
        assert!(
            err.to_string().contains("gpu.memory_bytes is 0 bytes"),
            "{err}"
        );
    }

    #[test]
    fn figures_read_back_exactly() {
        assert_eq!(round_figure(0.1 + 0.2), 0.3);
        assert_eq!(round_figure(18.908481062499998), 18.9084810625);
        assert!(round_figure(f64::NAN).is_nan());
        for x in [
            18.908481062499998,
            0.1 + 0.2,
            1234.5678901234567,
            0.0012345678901234,
            99999.99999999999,
        ] {
            let q = round_figure(x);
            assert_eq!(round_figure(q), q, "idempotent");
            let text = serde_json::to_string(&q).unwrap();
            assert_eq!(serde_json::from_str::<f64>(&text).unwrap(), q, "{text}");
        }
    }

    #[test]
    fn peak_tflops_by_dtype() {
        let v100 = PeakTflops::new(None, 125.0);
        assert_eq!(v100.get(Dtype::Fp16), Some(125.0));
        assert_eq!(v100.get(Dtype::Bf16), None);
        assert_eq!(Dtype::Bf16.to_string(), "bf16");
        assert_eq!(
            serde_json::from_str::<Source>("\"imported\"").ok(),
            Some(Source::Imported)
        );
        assert!(serde_json::from_str::<Source>("\"guess\"").is_err());
    }

    /// `measured_tflops` holds one figure per dtype: one is written as an object (the
    /// shape older profiles have, which still reads), several as a list; a dtype given
    /// twice is refused by its path.
    #[test]
    fn measured_figures_are_one_object_or_a_list_one_per_dtype() {
        let figure = |dtype, tflops| MeasuredTflops {
            dtype,
            tflops,
            provenance: Provenance::new(Source::Measured),
        };
        let set = |figures: Vec<MeasuredTflops>| {
            let mut p = two_nodes();
            if let GpuInventory::Known { gpus, .. } = &mut p.nodes[0].gpus {
                gpus[0].measured_tflops = figures;
            }
            p
        };
        let one = set(vec![figure(Dtype::Bf16, 250.0)]);
        let json = one.to_json_pretty();
        assert!(json.contains("\"measured_tflops\": {"), "{json}");
        assert_eq!(ClusterProfile::from_json_str(&json, "c.json").unwrap(), one);

        let two = set(vec![figure(Dtype::Bf16, 0.018), figure(Dtype::Fp32, 0.149)]);
        let json = two.to_json_pretty();
        assert!(json.contains("\"measured_tflops\": ["), "{json}");
        let back = ClusterProfile::from_json_str(&json, "c.json").unwrap();
        assert_eq!(back, two);
        let gpu = &back.nodes[0].gpus().unwrap()[0];
        assert_eq!(gpu.measured(Dtype::Fp32).unwrap().tflops, 0.149);
        assert!(gpu.measured(Dtype::Fp16).is_none());

        let twice = set(vec![figure(Dtype::Bf16, 1.0), figure(Dtype::Bf16, 2.0)]);
        let err = ClusterProfile::from_json_str(&twice.to_json_pretty(), "c.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nodes[0].gpus[0].measured_tflops[1].dtype is \"bf16\" a second time"),
            "{err}"
        );
    }

    /// A sweep section as the probe writes it: one GEMM in each layout, one attention
    /// shape, a copy, all-reduces of two sizes over two ranks.
    pub(crate) fn swept(gpu: &str) -> MeasuredPerf {
        let gemm = |m, layout, tflops| GemmFigure {
            m,
            n: 256,
            k: 128,
            layout,
            tflops,
        };
        let reduce = |bytes, us| CollectiveFigure {
            op: "all_reduce".into(),
            ranks: 2,
            bytes,
            us,
        };
        MeasuredPerf {
            gpu: gpu.into(),
            dtype: Dtype::Bf16,
            shape_set: "0123456789abcdef".into(),
            gemms: vec![
                gemm(128, GemmLayout::Fwd, 150.0),
                gemm(128, GemmLayout::Dgrad, 140.0),
                gemm(512, GemmLayout::Wgrad, 200.0),
            ],
            attention: vec![AttentionFigure {
                batch_heads: 8,
                seq: 1024,
                head_dim: 128,
                tflops: 100.0,
            }],
            hbm_gb_per_s: Some(1500.0),
            // 20 µs + 1 µs per KB.
            collectives: vec![reduce(1000, 21.0), reduce(64_000, 84.0)],
            provenance: Provenance::new(Source::Measured).with_date("2026-11-24"),
        }
    }

    #[test]
    fn the_sweep_section_reads_back_and_older_files_lack_it() {
        let old = two_nodes();
        let text = old.to_json_pretty();
        assert!(!text.contains("measured_perf"), "no empty section written");
        assert_eq!(
            ClusterProfile::from_json_str(&text, "old.json").unwrap(),
            old
        );

        let mut swept = two_nodes();
        swept.measured_perf.push(swept_section());
        let text = swept.to_json_pretty();
        assert!(text.contains("\"layout\": \"dgrad\""), "{text}");
        assert_eq!(
            ClusterProfile::from_json_str(&text, "swept.json").unwrap(),
            swept
        );
        // Narrowing the profile to some nodes keeps the section.
        let some = swept
            .subset(&[NodeSelection {
                host: "n1",
                devices: DeviceSelection::All,
            }])
            .unwrap();
        assert_eq!(some.measured_perf, swept.measured_perf);
    }

    fn swept_section() -> MeasuredPerf {
        swept("A100-SXM4-80GB")
    }

    #[test]
    fn a_broken_sweep_figure_is_named_by_its_path() {
        let mut swept = two_nodes();
        let mut perf = swept_section();
        perf.gemms[1].tflops = 0.0;
        swept.measured_perf.push(perf);
        let text = swept.to_json_pretty();
        let err = ClusterProfile::from_json_str(&text, "swept.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("measured_perf[0].gemms[1].tflops"), "{err}");
        let mut perf = swept_section();
        perf.collectives[0].us = -1.0;
        swept.measured_perf = vec![perf];
        let err = swept.validate("built").unwrap_err().to_string();
        assert!(err.contains("measured_perf[0].collectives[0].us"), "{err}");
        let unknown = text.replace("\"shape_set\"", "\"shapes\"");
        assert!(ClusterProfile::from_json_str(&unknown, "x.json").is_err());
    }

    #[test]
    fn all_reduce_latency_is_the_intercept_over_message_size() {
        let perf = swept_section();
        let latency = perf.all_reduce_latency_us(2).unwrap();
        assert!((latency - 20.0).abs() < 1e-9, "{latency}");
        assert_eq!(perf.all_reduce_latency_us(4), None, "no group of 4");
        let mut one = perf.clone();
        one.collectives.truncate(1);
        assert_eq!(one.all_reduce_latency_us(2), None, "one size: no line");
    }
}
