//! Every option of current torchrun, with its dash and underscore spellings and its
//! `PET_<NAME>` environment variable, so that replacing the word `torchrun` in a job
//! script keeps working.
//!
//! Values keep torchrun's own types and defaults. [`TorchrunOptions::passthrough_args`]
//! writes back the options a user changed, so the launcher hands them to the real
//! torchrun on every node.

use crate::log::printable;
use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args};

use super::values::whole;
use serde::{Deserialize, Serialize};

pub use crate::cluster::allocation::{NodeRange, NprocPerNode};

/// torchrun's options (as of PyTorch 2.9), in torchrun's order.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[command(next_help_heading = "torchrun options (same meaning as in torchrun)")]
pub struct TorchrunOptions {
    /// Number of nodes, or the range of nodes in form <minimum_nodes>:<maximum_nodes>.
    /// pipette-run plans on the nodes it discovers; a fixed count here must match them
    /// (torchrun's default: 1)
    #[arg(
        long,
        env = "PET_NNODES",
        value_name = "N|MIN:MAX",
        allow_negative_numbers = true
    )]
    pub nnodes: Option<NodeRange>,

    /// Number of workers per node; supported values: [auto, cpu, gpu, xpu, int].
    /// Unlike torchrun, the default is every GPU discovery or the cluster file finds on
    /// the node (1 when nothing says)
    #[arg(
        long = "nproc-per-node",
        alias = "nproc_per_node",
        env = "PET_NPROC_PER_NODE",
        value_name = "N|gpu|cpu|xpu|auto",
        allow_negative_numbers = true
    )]
    pub nproc_per_node: Option<NprocPerNode>,

    /// Rendezvous backend. pipette-run launches with `static` and explicit node ranks
    #[arg(
        long = "rdzv-backend",
        alias = "rdzv_backend",
        env = "PET_RDZV_BACKEND",
        default_value = "static"
    )]
    pub rdzv_backend: String,

    /// Rendezvous backend endpoint; usually in form <host>:<port>
    #[arg(
        long = "rdzv-endpoint",
        alias = "rdzv_endpoint",
        env = "PET_RDZV_ENDPOINT",
        default_value = "",
        value_parser = endpoint
    )]
    pub rdzv_endpoint: String,

    /// User-defined group id (defaults to the scheduler's job id when there is one)
    #[arg(
        long = "rdzv-id",
        alias = "rdzv_id",
        env = "PET_RDZV_ID",
        default_value = "none",
        value_parser = rendezvous_id
    )]
    pub rdzv_id: String,

    /// Additional rendezvous configuration (<key1>=<value1>,<key2>=<value2>,...)
    #[arg(
        long = "rdzv-conf",
        alias = "rdzv_conf",
        env = "PET_RDZV_CONF",
        default_value = ""
    )]
    pub rdzv_conf: String,

    /// Start a local standalone rendezvous backend (single-node, multi-worker jobs)
    #[arg(long, env = "PET_STANDALONE", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub standalone: bool,

    /// Maximum number of worker group restarts before failing
    #[arg(
        long = "max-restarts",
        alias = "max_restarts",
        env = "PET_MAX_RESTARTS",
        default_value_t = 0,
        allow_negative_numbers = true,
        value_parser = whole::<u32>
    )]
    pub max_restarts: u32,

    /// Interval, in seconds, to monitor the state of workers
    #[arg(long = "monitor-interval", alias = "monitor_interval", env = "PET_MONITOR_INTERVAL",
          default_value_t = 0.1, allow_negative_numbers = true, value_parser = non_negative_seconds)]
    pub monitor_interval: f64,

    /// Multiprocessing start method to use when creating workers
    #[arg(long = "start-method", alias = "start_method", env = "PET_START_METHOD",
          default_value = "spawn", value_parser = ["spawn", "fork", "forkserver"])]
    pub start_method: String,

    /// Name of a registered event logging handler
    #[arg(
        long = "event-log-handler",
        alias = "event_log_handler",
        env = "PET_EVENT_LOG_HANDLER",
        default_value = "null"
    )]
    pub event_log_handler: String,

    /// User-defined role for the workers
    #[arg(long, env = "PET_ROLE", default_value = "default")]
    pub role: String,

    /// Interpret SCRIPT as a Python module, as `python -m` does
    #[arg(short = 'm', long, env = "PET_MODULE", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub module: bool,

    /// Run SCRIPT directly instead of with python (for non-Python programs)
    #[arg(long = "no-python", alias = "no_python", env = "PET_NO_PYTHON",
          action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub no_python: bool,

    /// Run SCRIPT with runpy.run_path in the same interpreter (absolute path required)
    #[arg(long = "run-path", alias = "run_path", env = "PET_RUN_PATH",
          action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub run_path: bool,

    /// Base directory for log files (a job-level sub-directory is created per run)
    #[arg(
        long = "log-dir",
        alias = "log_dir",
        env = "PET_LOG_DIR",
        value_name = "DIR"
    )]
    pub log_dir: Option<String>,

    /// Redirect std streams into a log file in the log directory (e.g. `3`, or `0:1,1:2`)
    #[arg(short = 'r', long, env = "PET_REDIRECTS", default_value = "0", value_parser = std_streams)]
    pub redirects: String,

    /// Tee std streams into a log file and also to console (see --redirects for format)
    #[arg(short = 't', long, env = "PET_TEE", default_value = "0", value_parser = std_streams)]
    pub tee: String,

    /// Only show logs from these local ranks on the console (e.g. `0,1,2`)
    #[arg(long = "local-ranks-filter", alias = "local_ranks_filter", env = "PET_LOCAL_RANKS_FILTER",
          default_value = "", value_parser = rank_list)]
    pub local_ranks_filter: String,

    /// Rank of the node. pipette-run chooses node ranks itself; a value here is ignored
    /// when it launches every node, and kept when it runs a single node
    #[arg(
        long = "node-rank",
        alias = "node_rank",
        env = "PET_NODE_RANK",
        default_value_t = 0,
        allow_negative_numbers = true,
        value_parser = whole::<u32>
    )]
    pub node_rank: u32,

    /// Address of the rank-0 node (static rendezvous). pipette-run uses the host it maps
    /// to node rank 0 (127.0.0.1 when every node is this machine) unless this is given
    #[arg(
        long = "master-addr",
        alias = "master_addr",
        env = "PET_MASTER_ADDR",
        value_name = "MASTER_ADDR",
        value_parser = address
    )]
    pub master_addr: Option<String>,

    /// Port on the rank-0 node for the static rendezvous
    #[arg(
        long = "master-port",
        alias = "master_port",
        env = "PET_MASTER_PORT",
        default_value_t = 29500,
        allow_negative_numbers = true,
        value_parser = super::values::positive::<u16>
    )]
    pub master_port: u16,

    /// Address of the local node for connections (default: its FQDN)
    #[arg(long = "local-addr", alias = "local_addr", env = "PET_LOCAL_ADDR", value_parser = address)]
    pub local_addr: Option<String>,

    /// torchrun.logs_specs entry point name that overrides logging behaviour
    #[arg(long = "logs-specs", alias = "logs_specs")]
    pub logs_specs: Option<String>,

    /// Bind workers to CPUs by NUMA affinity
    #[arg(long = "numa-binding", alias = "numa_binding",
          value_parser = ["node", "socket", "exclusive", "core-complex"])]
    pub numa_binding: Option<String>,

    /// Comma-separated signals forwarded to the workers
    #[arg(long = "signals-to-handle", alias = "signals_to_handle", env = "PET_SIGNALS_TO_HANDLE",
          default_value = "SIGTERM,SIGINT,SIGHUP,SIGQUIT", value_parser = signal_list)]
    pub signals_to_handle: String,

    /// Seconds to wait for workers to exit after a termination signal before killing them
    #[arg(long = "shutdown-timeout", alias = "shutdown_timeout", env = "PET_SHUTDOWN_TIMEOUT",
          allow_negative_numbers = true, value_parser = non_negative_seconds)]
    pub shutdown_timeout: Option<f64>,

    /// Give each worker LOCAL_RANK=0 and its own device in CUDA_VISIBLE_DEVICES
    #[arg(long = "virtual-local-rank", alias = "virtual_local_rank", env = "PET_VIRTUAL_LOCAL_RANK",
          action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub virtual_local_rank: bool,

    /// Only duplicate to the log file the stdout lines that contain one of these strings
    #[arg(
        long = "duplicate-stdout-filters",
        alias = "duplicate_stdout_filters",
        env = "PET_DUPLICATE_STDOUT_FILTERS"
    )]
    pub duplicate_stdout_filters: Option<String>,

    /// Only duplicate to the log file the stderr lines that contain one of these strings
    #[arg(
        long = "duplicate-stderr-filters",
        alias = "duplicate_stderr_filters",
        env = "PET_DUPLICATE_STDERR_FILTERS"
    )]
    pub duplicate_stderr_filters: Option<String>,
}

impl TorchrunOptions {
    /// The options whose value differs from torchrun's default, spelled with dashes, as
    /// they must be handed on to torchrun. Options pipette-run decides itself (node
    /// count and rank, master address and port, rendezvous) are left out: the launcher
    /// writes those from the plan.
    pub fn passthrough_args(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut value = |name: &str, v: String, default: &str| {
            if v != default {
                out.push(format!("--{name}={v}"));
            }
        };
        value("max-restarts", self.max_restarts.to_string(), "0");
        value("monitor-interval", self.monitor_interval.to_string(), "0.1");
        value("start-method", self.start_method.clone(), "spawn");
        value("event-log-handler", self.event_log_handler.clone(), "null");
        value("role", self.role.clone(), "default");
        value("log-dir", self.log_dir.clone().unwrap_or_default(), "");
        value("redirects", self.redirects.clone(), "0");
        value("tee", self.tee.clone(), "0");
        value("local-ranks-filter", self.local_ranks_filter.clone(), "");
        value(
            "local-addr",
            self.local_addr.clone().unwrap_or_default(),
            "",
        );
        value(
            "logs-specs",
            self.logs_specs.clone().unwrap_or_default(),
            "",
        );
        value(
            "numa-binding",
            self.numa_binding.clone().unwrap_or_default(),
            "",
        );
        value(
            "signals-to-handle",
            self.signals_to_handle.clone(),
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        );
        let timeout = self
            .shutdown_timeout
            .map(|t| t.to_string())
            .unwrap_or_default();
        value("shutdown-timeout", timeout, "");
        value(
            "duplicate-stdout-filters",
            self.duplicate_stdout_filters.clone().unwrap_or_default(),
            "",
        );
        value(
            "duplicate-stderr-filters",
            self.duplicate_stderr_filters.clone().unwrap_or_default(),
            "",
        );
        for (flag, on) in [
            ("module", self.module),
            ("no-python", self.no_python),
            ("run-path", self.run_path),
            ("virtual-local-rank", self.virtual_local_rank),
        ] {
            if on {
                out.push(format!("--{flag}"));
            }
        }
        out
    }
}

/// `HOST[:PORT]` (`[V6]:PORT`, or a bare IPv6 address): a port given must be one
/// (1 to 65535). `host:99999` was read as no port, and 29500 silently used.
fn endpoint(s: &str) -> Result<String, String> {
    let t = s.trim();
    let port = match t.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && (!host.contains(':') || host.ends_with(']')) => {
            Some(port)
        }
        _ => None,
    };
    match port.map(super::values::positive::<u16>) {
        Some(Err(_)) => Err(format!(
            "{:?}: the port {:?} is not a port number (give HOST:PORT, the port from 1 to 65535)",
            printable(s),
            port.unwrap_or_default()
        )),
        _ => match super::resolved::rendezvous_endpoint(t).0 {
            Some(host) => address(&host).map(|_| s.to_string()),
            None => Ok(s.to_string()),
        },
    }
}

/// `--master-addr`, `--local-addr` and the host of `--rdzv-endpoint`: a host name or address
/// as the node lists take them ([`crate::cluster::host_name_problem`]); an escape sequence
/// there reached the terminal and the launch scripts raw.
fn address(s: &str) -> Result<String, String> {
    match crate::cluster::host_name_problem(s) {
        Some(problem) => Err(format!(
            "\"{}\" {problem} (give the node's host name or IP address)",
            crate::cluster::shown_host(s)
        )),
        None => Ok(s.to_string()),
    }
}

/// `--rdzv-id`: any text torchrun takes, but no control or invisible format character (it
/// reached the terminal and the launch scripts raw).
fn rendezvous_id(s: &str) -> Result<String, String> {
    if s.chars()
        .any(|c| c.is_control() || crate::log::is_format_char(c))
    {
        return Err(format!(
            "{:?} holds a control or invisible character (give a plain job id)",
            printable(s)
        ));
    }
    Ok(s.to_string())
}

/// torchrun's seconds (`--monitor-interval`, `--shutdown-timeout`): at most
/// [`super::values::MAX_DURATION`], as every duration; 2^64 s passed and made torchrun's
/// sleep overflow on every node.
fn non_negative_seconds(s: &str) -> Result<f64, String> {
    let most = super::values::MAX_DURATION.as_secs_f64();
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=most).contains(&v) => Ok(v),
        Ok(v) if v.is_finite() && v > most => Err(format!(
            "{s:?} seconds is too long (give at most 10 years, {most} s)"
        )),
        _ => Err(format!(
            "{:?} is not a number of seconds of 0 or more (e.g. 0.5)",
            printable(s)
        )),
    }
}

/// torchrun's `Std` syntax: one stream code for every rank (`3`), or `rank:code` pairs
/// (`0:1,1:2`), codes 0 (none), 1 (stdout), 2 (stderr), 3 (both).
fn std_streams(s: &str) -> Result<String, String> {
    let code_ok = |c: &str| matches!(c.trim(), "0" | "1" | "2" | "3");
    let ok = if s.contains(':') {
        s.split(',').all(|pair| match pair.split_once(':') {
            Some((rank, code)) => rank.trim().parse::<u32>().is_ok() && code_ok(code),
            None => false,
        })
    } else {
        code_ok(s)
    };
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a stream spec (0 none, 1 stdout, 2 stderr, 3 both; or per local rank, e.g. 0:1,1:2)"
        ))
    }
}

fn rank_list(s: &str) -> Result<String, String> {
    if s.is_empty() || s.split(',').all(|r| r.trim().parse::<u32>().is_ok()) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a list of local ranks (comma-separated integers, e.g. 0,1,2)"
        ))
    }
}

fn signal_list(s: &str) -> Result<String, String> {
    const KNOWN: &[&str] = &[
        "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCONT", "SIGALRM",
    ];
    match s.split(',').map(str::trim).find(|sig| !KNOWN.contains(sig)) {
        None => Ok(s.to_string()),
        Some(bad) => Err(format!(
            "{bad:?} is not a signal torchrun can forward (use names such as SIGTERM,SIGUSR1)"
        )),
    }
}
