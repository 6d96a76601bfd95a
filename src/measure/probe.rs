//! The link and compute probe: `templates/probe/bandwidth.py` run by torchrun on every node.
//!
//! [`run_probe`] runs it as a staged job ([`crate::exec::staged`]): the template (embedded
//! in the binary) is copied into a fresh temporary directory on every node, node 0 gets a
//! free port, one torchrun per node starts with the static rendezvous (`--node-rank i`,
//! node 0 the master, so ranks are node-major); the progress lines rank 0 prints are
//! followed, every node is stopped as soon as one fails, and the one result line is read.
//! The directories are removed afterwards, whatever happened.
//!
//! # Protocol (see the template's docstring)
//!
//! - Pairs inside a node: every pair of its ranks (GPUs); pairs across nodes: every pair of
//!   nodes, between the first rank of each — "a GPU pair, i.e. one NIC", as `node_links`
//!   means it. Above [`ALL_NODE_PAIRS_UP_TO`] nodes, a sample instead ([`NodePairs`]):
//!   every pair would be n² measurements (10,000 nodes: 50 million pairs, 9,999 rounds).
//! - Rounds of disjoint pairs from a round-robin tournament; every node's round `r` runs
//!   at once; other ranks wait at a barrier between rounds.
//! - Each direction separately: handshake, then the sender streams `iters` messages of one
//!   size and the receiver acknowledges; bandwidth = `iters × size / elapsed` on the sender
//!   (GB/s, 10⁹ bytes/s). `warmup` unrecorded runs, then the median of `repeats`.
//! - Rails (protocol 2): after the node pairs, local rank `i` of node 0 streams to local
//!   rank `i` of node 1 for every `i` below `--rails` ([`ProbeRequest::rails`]: the
//!   node's NICs when known, else as many as both nodes have ranks), all at once (every
//!   rank meets at a barrier before each run), each direction; each sender records its
//!   figure as a link of kind `rails`. The first pair is the sample because its one-NIC
//!   figure is measured in every layout of node pairs (the tournament, and stride 1 around
//!   the ring), so the rails compare with one rail on the same two nodes. Fewer than two
//!   rails: not measured (the node pair is the one rail).
//! - The profile keeps the figure at the largest message size; the others are in the
//!   [`ProbeReport`].
//! - Compute: every rank at once multiplies `n × n` matrices (bf16 on GPUs of compute
//!   capability 8 and up, fp16 below; fp32 and bf16 on CPUs) and reports the median
//!   `2n³ / time`.
//! - Sweep (with a [`SweepSpec`]): the first rank of every device name times GEMMs at
//!   the given shapes and layouts, causal attention, and a large copy, alone; then rank 0
//!   times all-reduce and all-gather over message sizes for groups of the first 2, 4, ...
//!   ranks and all of them. Each part stops starting shapes past the time budget.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cluster::profile::{AttentionFigure, AttentionShape, Dtype, GemmFigure, GemmShape};

use crate::exec::staged::{self, JobError, StageError, StagedFile};
use crate::exec::{ExecOptions, NodeCommand, Status, Stream, Transport};

use super::progress::{Phase, Progress};
use super::ProfileRunError;

/// The probe script, embedded.
pub const TEMPLATE: &str = include_str!("../../templates/probe/bandwidth.py");
/// Its file name on the nodes.
pub const TEMPLATE_NAME: &str = "bandwidth.py";
/// The result format this code reads.
pub const PROTOCOL: u32 = 2;
/// What measured the figures, as provenance records it.
pub const TOOL: &str = concat!("pipette-run probe v", env!("CARGO_PKG_VERSION"));

/// The staged directories' name prefix on the nodes.
const STAGING_PREFIX: &str = "pipette-probe";

const RESULT_MARK: &str = "PIPETTE-PROBE-RESULT ";
const PROGRESS_MARK: &str = "PIPETTE-PROBE-PROGRESS ";

/// The communication backend: NCCL between GPUs, gloo between CPU processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Nccl,
    Gloo,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Nccl => "nccl",
            Backend::Gloo => "gloo",
        }
    }
}

/// Up to this many nodes the probe measures every node pair (n − 1 rounds); above, a
/// sample of [`SAMPLE_STRIDES`] pairs per node in a few rounds.
pub const ALL_NODE_PAIRS_UP_TO: usize = 32;

/// A node is measured with the nodes 1 and 2 places after it around the ring of nodes
/// (neighbours, which often share a switch) and the node half-way round (far across the
/// fabric): every node takes part in six pairs, enough for a slow node or NIC to show in
/// all of its figures.
pub const SAMPLE_STRIDES: usize = 3;

/// Which node pairs the probe measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePairs {
    /// Every pair (a round-robin tournament).
    All,
    /// Node `i` with node `(i + s) mod n` for each stride `s`.
    Ring { strides: Vec<usize> },
}

impl NodePairs {
    /// What the probe measures on `nodes` nodes.
    pub fn for_nodes(nodes: usize) -> NodePairs {
        if nodes <= ALL_NODE_PAIRS_UP_TO {
            return NodePairs::All;
        }
        let mut strides = vec![1, 2, nodes / 2];
        strides.dedup();
        debug_assert_eq!(strides.len(), SAMPLE_STRIDES);
        NodePairs::Ring { strides }
    }

    /// The unordered pairs `(a, b)`, `a < b`, measured (both directions) on `nodes` nodes,
    /// sorted; every pair when [`NodePairs::All`].
    pub fn pairs(&self, nodes: usize) -> Vec<(usize, usize)> {
        let mut pairs: Vec<(usize, usize)> = match self {
            NodePairs::All => (0..nodes)
                .flat_map(|a| (a + 1..nodes).map(move |b| (a, b)))
                .collect(),
            NodePairs::Ring { strides } => strides
                .iter()
                .flat_map(|s| (0..nodes).map(move |i| (i, (i + s) % nodes)))
                .filter(|(a, b)| a != b)
                .map(|(a, b)| (a.min(b), a.max(b)))
                .collect(),
        };
        pairs.sort_unstable();
        pairs.dedup();
        pairs
    }
}

/// How much the probe measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSettings {
    /// Message sizes, bytes; the profile keeps the largest size's figure.
    pub sizes: Vec<u64>,
    pub warmup: u32,
    pub repeats: u32,
    /// About this many bytes are streamed per timed repeat (at most `max_iters` messages).
    pub bytes_per_repeat: u64,
    pub max_iters: u32,
    /// Matrix size of the compute probe.
    pub compute_n: u32,
    pub compute_repeats: u32,
}

impl ProbeSettings {
    /// GPUs: 1, 16 and 64 MiB messages, 2 warm-ups, median of 5; 8192² matmuls.
    pub fn gpu() -> Self {
        ProbeSettings {
            sizes: vec![1 << 20, 16 << 20, 64 << 20],
            warmup: 2,
            repeats: 5,
            bytes_per_repeat: 512 << 20,
            max_iters: 64,
            compute_n: 8192,
            compute_repeats: 5,
        }
    }

    /// CPU stand-ins: 64 KiB, 1 MiB and 4 MiB messages, 1 warm-up, median of 3; 512²
    /// matmuls (a CPU is slow, and several processes share it).
    pub fn cpu() -> Self {
        ProbeSettings {
            sizes: vec![64 << 10, 1 << 20, 4 << 20],
            warmup: 1,
            repeats: 3,
            bytes_per_repeat: 16 << 20,
            max_iters: 32,
            compute_n: 512,
            compute_repeats: 3,
        }
    }

    pub fn for_backend(backend: Backend) -> Self {
        match backend {
            Backend::Nccl => Self::gpu(),
            Backend::Gloo => Self::cpu(),
        }
    }

    /// The size whose figures go into the profile.
    pub fn reported_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(0)
    }
}

/// What the sweep measures: the shapes come from the model being planned (the caller
/// chooses them), the sizes and budget from the kind of node ([`SweepSpec::for_backend`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SweepSpec {
    /// The dtype the model trains in.
    pub dtype: Dtype,
    pub gemms: Vec<GemmShape>,
    pub attention: Vec<AttentionShape>,
    /// Bytes of the memory-bandwidth copy.
    pub hbm_bytes: u64,
    /// Collective message sizes, bytes per rank.
    pub collective_sizes: Vec<u64>,
    pub repeats: u32,
    /// Seconds each part (devices, collectives) may take before it stops starting shapes.
    pub budget_s: u32,
}

/// The shapes of a sweep, as the caller (who knows the model) gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepShapes {
    pub dtype: Dtype,
    pub gemms: Vec<GemmShape>,
    pub attention: Vec<AttentionShape>,
}

impl SweepSpec {
    /// `shapes` with the sizes of `backend`: on GPUs a 1 GiB copy, 1 KiB to 64 MiB
    /// messages, median of 5, 60 s a part; on CPU stand-ins a 64 MiB copy, 1 KiB to 1 MiB
    /// messages, median of 3, 3 s a part (a CPU is slow, and the stand-ins share it).
    pub fn for_backend(shapes: SweepShapes, backend: Backend) -> Self {
        let (hbm_bytes, top, repeats, budget_s) = match backend {
            Backend::Nccl => (1u64 << 30, 64u64 << 20, 5, 60),
            Backend::Gloo => (64 << 20, 1 << 20, 3, 3),
        };
        let collective_sizes = std::iter::successors(Some(1u64 << 10), |s| Some(s * 16))
            .take_while(|s| *s <= top)
            .collect();
        SweepSpec {
            dtype: shapes.dtype,
            gemms: shapes.gemms,
            attention: shapes.attention,
            hbm_bytes,
            collective_sizes,
            repeats,
            budget_s,
        }
    }

    /// The argument of the template's `--sweep`.
    pub fn to_json(&self) -> String {
        let gemms: Vec<(u64, u64, u64, &str)> = self
            .gemms
            .iter()
            .map(|g| (g.m, g.n, g.k, g.layout.as_str()))
            .collect();
        let attention: Vec<(u64, u64, u64)> = self
            .attention
            .iter()
            .map(|a| (a.batch_heads, a.seq, a.head_dim))
            .collect();
        serde_json::json!({
            "dtype": self.dtype.as_str(),
            "gemms": gemms,
            "attention": attention,
            "hbm_bytes": self.hbm_bytes,
            "collective_sizes": self.collective_sizes,
            "repeats": self.repeats,
            "budget_s": self.budget_s,
        })
        .to_string()
    }
}

/// One node's part of the probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeNode {
    pub host: String,
    /// Processes (GPUs, or CPU stand-ins) on the node.
    pub nproc: u32,
    /// Environment for torchrun there (`CUDA_VISIBLE_DEVICES`, ...).
    pub env: Vec<(String, String)>,
    /// CPU threads per rank (CPU stand-ins).
    pub threads: Option<u32>,
}

/// Everything [`run_probe`] needs.
#[derive(Debug, Clone)]
pub struct ProbeRequest<'a> {
    pub transport: &'a Transport,
    pub nodes: Vec<ProbeNode>,
    pub backend: Backend,
    pub settings: ProbeSettings,
    pub torchrun: &'a str,
    /// Runs the free-port query on node 0 (remote transports).
    pub python: &'a str,
    pub master_addr: String,
    pub master_port: Option<u16>,
    /// For the whole probe (and torch's collective timeout).
    pub timeout: Duration,
    /// For staging, port query and cleanup commands.
    pub command_timeout: Duration,
    pub grace: Duration,
    /// The performance sweep, if any.
    pub sweep: Option<SweepSpec>,
    /// Measure the sweep alone: the links and matmul figures come from the cache, so the
    /// report's `links` and `compute` are empty.
    pub sweep_only: bool,
    /// Rank pairs the rails phase streams at once between the first two nodes (the NICs
    /// per node); `None`: as many as both nodes have ranks.
    pub rails: Option<u32>,
}

/// What the probe measured, as rank 0 printed it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ProbeReport {
    pub protocol: u32,
    pub backend: String,
    pub torch: String,
    pub world_size: usize,
    pub sizes: Vec<u64>,
    pub warmup: u32,
    pub repeats: u32,
    pub ranks: Vec<RankInfo>,
    pub links: Vec<LinkRecord>,
    pub compute: Vec<ComputeRecord>,
    pub elapsed_s: f64,
    /// The sweep per device name (empty without one).
    #[serde(default)]
    pub sweep: Vec<SweepRecord>,
    /// The sweep's collectives, as rank 0 timed them.
    #[serde(default)]
    pub collectives: Vec<CollectiveRecord>,
    #[serde(default)]
    pub collectives_skipped: u32,
}

/// What the sweep measured on the first rank of one device name.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SweepRecord {
    pub rank: usize,
    /// The device name (`cpu` for stand-ins).
    pub name: String,
    /// `bf16` or `fp16`.
    pub dtype: String,
    pub gemms: Vec<GemmFigure>,
    pub attention: Vec<AttentionFigure>,
    pub hbm_gb_per_s: Option<f64>,
    /// Shapes left out when the budget ran out.
    pub skipped: u32,
}

/// One collective's median time.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CollectiveRecord {
    pub op: String,
    pub ranks: u32,
    pub bytes: u64,
    pub us: f64,
}

/// One rank: where it ran and on what.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RankInfo {
    pub rank: usize,
    /// torchrun's node rank (`GROUP_RANK`).
    pub node: usize,
    pub local_rank: usize,
    pub hostname: String,
    /// `cuda` or `cpu`.
    pub device: String,
    pub name: String,
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    #[serde(default)]
    pub host_memory_bytes: Option<u64>,
    #[serde(default)]
    pub cpus: Option<u32>,
    #[serde(default)]
    pub threads: Option<u32>,
}

/// One measured direction of one pair at one size.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LinkRecord {
    /// `intra` (inside a node), `inter` (between nodes) or `rails` (between the first two
    /// nodes, every rail at once).
    pub kind: String,
    pub src: usize,
    pub dst: usize,
    pub size: u64,
    pub iters: u32,
    pub gb_per_s: f64,
}

/// One rank's matrix-multiply throughput in one dtype.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ComputeRecord {
    pub rank: usize,
    /// `bf16`, `fp16` or `fp32`.
    pub dtype: String,
    pub n: u32,
    pub tflops: f64,
}

/// A progress line of the probe.
#[derive(Debug, Clone, PartialEq, Deserialize)]
struct ProgressLine {
    phase: String,
    #[serde(default)]
    done: u64,
    #[serde(default)]
    total: u64,
    #[serde(default)]
    gpu_pair_rounds: u64,
    #[serde(default)]
    node_pair_rounds: u64,
}

enum Event {
    Progress(ProgressLine),
    Result(String),
}

/// The torchrun command for node `node_rank` of `request`, running the template in `dir`.
pub fn torchrun_command(
    request: &ProbeRequest<'_>,
    node_rank: usize,
    dir: &str,
    master_port: u16,
) -> NodeCommand {
    let node = &request.nodes[node_rank];
    let s = &request.settings;
    let sizes: Vec<String> = s.sizes.iter().map(u64::to_string).collect();
    let mut command = NodeCommand::new(request.torchrun)
        .arg(format!("--nnodes={}", request.nodes.len()))
        .arg(format!("--nproc-per-node={}", node.nproc))
        .arg(format!("--node-rank={node_rank}"))
        .arg(format!("--master-addr={}", request.master_addr))
        .arg(format!("--master-port={master_port}"))
        .arg("--max-restarts=0")
        .arg(format!("{dir}/{TEMPLATE_NAME}"))
        .args([
            "--backend".to_owned(),
            request.backend.as_str().to_owned(),
            "--sizes".to_owned(),
            sizes.join(","),
            "--warmup".to_owned(),
            s.warmup.to_string(),
            "--repeats".to_owned(),
            s.repeats.to_string(),
            "--bytes-per-repeat".to_owned(),
            s.bytes_per_repeat.to_string(),
            "--max-iters".to_owned(),
            s.max_iters.to_string(),
            "--compute-n".to_owned(),
            s.compute_n.to_string(),
            "--compute-repeats".to_owned(),
            s.compute_repeats.to_string(),
            "--timeout".to_owned(),
            request.timeout.as_secs().max(1).to_string(),
        ]);
    if let NodePairs::Ring { strides } = NodePairs::for_nodes(request.nodes.len()) {
        let strides: Vec<String> = strides.iter().map(usize::to_string).collect();
        command = command.args(["--node-pair-strides".to_owned(), strides.join(",")]);
    }
    if let Some(rails) = request.rails {
        command = command.args(["--rails".to_owned(), rails.to_string()]);
    }
    if let Some(threads) = node.threads {
        command = command.args(["--threads".to_owned(), threads.to_string()]);
    }
    if let Some(sweep) = &request.sweep {
        command = command.args(["--sweep".to_owned(), sweep.to_json()]);
        if request.sweep_only {
            command = command.arg("--sweep-only");
        }
    }
    for (name, value) in &node.env {
        command = command.env(name, value);
    }
    command
}

/// Reads a result line's JSON.
pub fn parse_report(json: &str) -> Result<ProbeReport, String> {
    let report: ProbeReport = serde_json::from_str(json).map_err(|e| e.to_string())?;
    if report.protocol != PROTOCOL {
        return Err(format!(
            "protocol {} (this pipette-run reads {PROTOCOL})",
            report.protocol
        ));
    }
    Ok(report)
}

/// Runs the probe on every node of `request`.
pub fn run_probe(
    request: &ProbeRequest<'_>,
    progress: &dyn Progress,
) -> Result<ProbeReport, ProfileRunError> {
    if request.nodes.is_empty() {
        return Err(ProfileRunError::NoNodes);
    }
    progress.start(Phase::Launch, request.nodes.len() as u64);
    let hosts: Vec<String> = request.nodes.iter().map(|n| n.host.clone()).collect();
    let file = StagedFile {
        prefix: STAGING_PREFIX,
        name: TEMPLATE_NAME,
        contents: TEMPLATE.as_bytes(),
    };
    let staged = staged::stage(
        request.transport,
        &hosts,
        &file,
        request.command_timeout,
        request.grace,
    )
    .map_err(stage_error)?;
    let port = match request.master_port {
        Some(port) => port,
        None => staged::free_port(
            request.transport,
            &hosts[0],
            request.python,
            request.command_timeout,
        )
        .map_err(stage_error)?,
    };

    let (tx, rx) = mpsc::channel::<Event>();
    let sink = Arc::new(move |_host: &str, stream: Stream, line: &[u8]| {
        if stream != Stream::Stdout {
            return;
        }
        let text = String::from_utf8_lossy(line);
        if let Some(json) = text.strip_prefix(RESULT_MARK) {
            let _ = tx.send(Event::Result(json.to_owned()));
        } else if let Some(json) = text.strip_prefix(PROGRESS_MARK) {
            if let Ok(p) = serde_json::from_str::<ProgressLine>(json) {
                let _ = tx.send(Event::Progress(p));
            }
        }
    });
    let exec_options = ExecOptions {
        grace: request.grace,
        // The result line can be large; it reaches the sink whole, so only a tail is kept.
        capture_limit: Some(256 << 10),
        sink: Some(sink),
    };
    let commands: Vec<(String, NodeCommand)> = staged
        .iter()
        .enumerate()
        .map(|(rank, (host, dir))| (host.to_owned(), torchrun_command(request, rank, dir, port)))
        .collect();

    let mut result: Option<String> = None;
    let mut phases = Phases::default();
    let mut launched = false;
    let outcome = staged::run_on_every_node(
        request.transport,
        &commands,
        &exec_options,
        request.timeout,
        None,
        |_| {
            if !launched {
                progress.update(Phase::Launch, commands.len() as u64);
                progress.finish(Phase::Launch);
                launched = true;
            }
            for event in rx.try_iter() {
                match event {
                    Event::Result(json) => result = Some(json),
                    Event::Progress(p) => phases.follow(&p, progress),
                }
            }
        },
    );
    match outcome {
        Ok(_) => {}
        Err(JobError::Exec(e)) => return Err(e.into()),
        Err(JobError::Failed { end, outputs }) => {
            let (stdout, stderr) = &outputs[end.node];
            return Err(ProfileRunError::ProbeFailed {
                host: request.nodes[end.node].host.clone(),
                status: end.status().unwrap_or(Status::Exited(-1)),
                detail: diagnose(stderr, stdout),
                output: String::from_utf8_lossy(stderr).into_owned(),
            });
        }
        Err(JobError::TimedOut { limit, .. }) => {
            return Err(ProfileRunError::ProbeTimedOut { limit, hosts });
        }
    }
    phases.finish(progress);
    let json = result.ok_or_else(|| ProfileRunError::NoResult {
        host: request.nodes[0].host.clone(),
    })?;
    parse_report(&json).map_err(|detail| ProfileRunError::BadResult { detail })
}

fn stage_error(e: StageError) -> ProfileRunError {
    match e {
        StageError::Exec(e) => e.into(),
        StageError::Node { host, detail } => ProfileRunError::Stage { host, detail },
    }
}

/// Follows the probe's phases onto progress bars.
#[derive(Default)]
struct Phases {
    started: Vec<Phase>,
}

impl Phases {
    fn follow(&mut self, line: &ProgressLine, progress: &dyn Progress) {
        let phase = match line.phase.as_str() {
            "plan" => {
                progress.start(Phase::GpuPairs, line.gpu_pair_rounds);
                progress.start(Phase::NodePairs, line.node_pair_rounds);
                progress.start(Phase::Compute, 1);
                self.started = vec![Phase::GpuPairs, Phase::NodePairs, Phase::Compute];
                return;
            }
            "gpu_pairs" => Phase::GpuPairs,
            "node_pairs" => Phase::NodePairs,
            "compute" => Phase::Compute,
            _ => return,
        };
        progress.update(phase, line.done);
        if line.done >= line.total {
            progress.finish(phase);
        }
    }

    fn finish(&self, progress: &dyn Progress) {
        for phase in &self.started {
            progress.finish(*phase);
        }
    }
}

/// The most telling line of a failed node's output: the last Python exception, else the
/// last line.
fn diagnose(stderr: &[u8], stdout: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let exception = text.lines().rev().map(str::trim).find(|l| {
        let head = l.split(':').next().unwrap_or("");
        (head.ends_with("Error") || head.ends_with("Exception"))
            && !head.contains(' ')
            && !l.contains("ChildFailedError")
    });
    if let Some(line) = exception {
        return line.to_owned();
    }
    let out = crate::exec::Output {
        status: Status::Exited(1),
        stdout: stdout.to_vec(),
        stderr: stderr.to_vec(),
    };
    out.last_line().unwrap_or_else(|| "no output".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(transport: &Transport) -> ProbeRequest<'_> {
        ProbeRequest {
            transport,
            nodes: vec![
                ProbeNode {
                    host: "a".into(),
                    nproc: 2,
                    env: vec![("GLOO_SOCKET_IFNAME".into(), "lo".into())],
                    threads: Some(1),
                },
                ProbeNode {
                    host: "b".into(),
                    nproc: 1,
                    env: vec![],
                    threads: None,
                },
            ],
            backend: Backend::Gloo,
            settings: ProbeSettings::cpu(),
            torchrun: "/venv/bin/torchrun",
            python: "python3",
            master_addr: "127.0.0.1".into(),
            master_port: None,
            timeout: Duration::from_secs(90),
            command_timeout: Duration::from_secs(10),
            grace: Duration::from_secs(1),
            sweep: None,
            sweep_only: false,
            rails: None,
        }
    }

    #[test]
    fn torchrun_gets_a_static_rendezvous_and_node_rank() {
        let t = Transport::Local;
        let r = request(&t);
        let c = torchrun_command(&r, 0, "/tmp/pipette-probe.abc", 29500);
        assert_eq!(c.program, "/venv/bin/torchrun");
        assert_eq!(
            c.args[..7],
            [
                "--nnodes=2",
                "--nproc-per-node=2",
                "--node-rank=0",
                "--master-addr=127.0.0.1",
                "--master-port=29500",
                "--max-restarts=0",
                "/tmp/pipette-probe.abc/bandwidth.py"
            ]
        );
        let line = c.args.join(" ");
        assert!(
            line.contains("--backend gloo --sizes 65536,1048576,4194304"),
            "{line}"
        );
        assert!(line.ends_with("--timeout 90 --threads 1"), "{line}");
        let railed = ProbeRequest {
            rails: Some(8),
            ..r.clone()
        };
        let line = torchrun_command(&railed, 0, "/tmp/pipette-probe.abc", 29500)
            .args
            .join(" ");
        assert!(line.ends_with("--rails 8 --threads 1"), "{line}");
        assert_eq!(c.env, [("GLOO_SOCKET_IFNAME".into(), "lo".into())]);
        let c = torchrun_command(&r, 1, "/tmp/pipette-probe.abc", 29500);
        assert!(c.args.contains(&"--node-rank=1".to_owned()));
        assert!(!c.args.contains(&"--threads".to_owned()));
        assert!(!c.args.contains(&"--sweep".to_owned()));
        let shapes = SweepShapes {
            dtype: Dtype::Bf16,
            gemms: vec![],
            attention: vec![],
        };
        let swept = ProbeRequest {
            sweep: Some(SweepSpec::for_backend(shapes, Backend::Gloo)),
            ..r
        };
        let c = torchrun_command(&swept, 1, "/tmp/pipette-probe.abc", 29500);
        let at = c.args.iter().position(|a| a == "--sweep").unwrap();
        assert_eq!(c.args[at + 1], swept.sweep.as_ref().unwrap().to_json());
        assert!(!c.args.contains(&"--sweep-only".to_owned()));
        let alone = ProbeRequest {
            sweep_only: true,
            ..swept
        };
        let c = torchrun_command(&alone, 1, "/tmp/pipette-probe.abc", 29500);
        assert_eq!(c.args.last().map(String::as_str), Some("--sweep-only"));
    }

    #[test]
    fn the_last_exception_explains_a_failure() {
        let stderr = b"Traceback (most recent call last):\n  File \"x\", line 1\nRuntimeError: Connection refused\n[rank0]: torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \nfoo\n";
        assert_eq!(diagnose(stderr, b""), "RuntimeError: Connection refused");
        assert_eq!(diagnose(b"just this\n", b""), "just this");
        assert_eq!(diagnose(b"", b""), "no output");
    }

    #[test]
    fn reports_of_another_protocol_are_refused() {
        let err = parse_report(r#"{"protocol": 1}"#).unwrap_err();
        assert!(
            err.contains("missing field") || err.contains("protocol"),
            "{err}"
        );
        let ok = r#"{"protocol": 2, "backend": "gloo", "torch": "2.15", "world_size": 1,
            "sizes": [1], "warmup": 1, "repeats": 1, "ranks": [], "links": [], "compute": [],
            "elapsed_s": 1.0, "extra": true}"#;
        assert_eq!(parse_report(ok).unwrap().world_size, 1);
        let one = ok.replace("\"protocol\": 2", "\"protocol\": 1");
        assert!(parse_report(&one).unwrap_err().starts_with("protocol 1"));
    }

    #[test]
    fn the_template_speaks_this_protocol() {
        assert!(TEMPLATE.contains(&format!("\nPROTOCOL = {PROTOCOL}\n")));
        assert!(TEMPLATE.contains(RESULT_MARK));
        assert!(TEMPLATE.contains(PROGRESS_MARK));
    }
}
