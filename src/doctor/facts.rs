//! What `pipette doctor` learns of a node: the probe's output ([`PROBE`]) read into
//! [`NodeFacts`], with no judgement yet (that is [`super::checks`]). Pure.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::measure::inventory::parse_gpu_query;

/// The POSIX `sh` script run on every node (`sh -c PROBE pipette-doctor ARGS...`).
pub(super) const PROBE: &str = include_str!("../../templates/doctor/probe.sh");

/// The Python script the probe runs with torchrun's python.
pub(super) const PYTHON_FACTS: &str = include_str!("../../templates/doctor/facts.py");

/// Everything gathered about one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeFacts {
    pub host: String,
    /// Whether the probe ran there, and if not, why.
    pub reach: Reach,
    /// The node's `PATH` as the probe saw it (with the forwarded environment).
    pub path: Option<String>,
    pub torchrun: Torchrun,
    pub python: PythonFacts,
    pub gpus: Gpus,
    /// The `NCCL_*` variables set there.
    pub nccl: BTreeMap<String, String>,
    /// The node's clock against this machine's.
    pub clock: Option<ClockSkew>,
    pub disk: Disk,
}

/// Whether the node answered.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Reach {
    Reached,
    /// The transport could not reach it (or the probe could not start there).
    Unreachable {
        why: String,
    },
    /// It did not answer within the time limit: hung, or very slow.
    TimedOut {
        seconds: f64,
    },
}

/// torchrun on the node's `PATH` (or at `--torchrun`'s path).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Torchrun {
    Found {
        path: String,
    },
    Missing {
        name: String,
        /// A venv's torchrun there, not on the PATH (its python is the one checked).
        #[serde(skip_serializing_if = "Option::is_none")]
        venv: Option<String>,
    },
    /// Not known: the node was not reached, or the probe's output said nothing of it.
    Unknown,
}

/// torchrun's python and what it imports.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PythonFacts {
    /// The interpreter the probe ran (`None`: none found).
    pub executable: Option<String>,
    pub version: Option<String>,
    /// PyTorch's version, when it imports.
    pub torch: Option<String>,
    /// Why `import torch` failed (the exception's first line), when it did.
    pub torch_error: Option<String>,
    /// The CUDA version PyTorch was built with (`None`: a CPU build).
    pub cuda: Option<String>,
    /// GPUs PyTorch sees.
    pub cuda_devices: Option<u32>,
    pub megatron_core: Option<String>,
    /// Why the interpreter could not run the facts script (its last line), when it could not.
    pub error: Option<String>,
}

/// The node's GPUs, as `nvidia-smi` lists them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Gpus {
    /// `nvidia-smi` is not there: a CPU node.
    NoNvidiaSmi,
    /// `nvidia-smi` ran and failed, or printed what cannot be read.
    Failed {
        why: String,
    },
    Listed {
        gpus: Vec<Gpu>,
    },
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gpu {
    pub name: String,
    pub memory_bytes: u64,
}

/// A node's clock minus this machine's, at the midpoint of the probe's round trip.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClockSkew {
    pub seconds: f64,
    /// Half the round trip: the true skew is within this of `seconds`.
    pub uncertainty_seconds: f64,
}

/// Free space where the run directory goes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Disk {
    Known {
        /// The nearest existing directory of the run directory's path.
        dir: String,
        free_bytes: u64,
        writable: bool,
    },
    Failed {
        why: String,
    },
    Unknown,
}

impl NodeFacts {
    /// A node that was not reached: nothing is known of it.
    pub fn unreached(host: &str, reach: Reach) -> NodeFacts {
        NodeFacts {
            host: host.to_string(),
            reach,
            path: None,
            torchrun: Torchrun::Unknown,
            python: PythonFacts::default(),
            gpus: Gpus::Unknown,
            nccl: BTreeMap::new(),
            clock: None,
            disk: Disk::Unknown,
        }
    }

    pub fn reached(&self) -> bool {
        self.reach == Reach::Reached
    }
}

/// The probe's output on `host` read into facts. `clock_midpoint`: this machine's clock
/// (seconds since the epoch) halfway between starting the probe and reading its first line,
/// and half that interval.
pub fn parse_probe_output(host: &str, stdout: &str, clock_midpoint: (f64, f64)) -> NodeFacts {
    let mut facts = NodeFacts::unreached(host, Reach::Reached);
    let mut values: BTreeMap<&str, &str> = BTreeMap::new();
    let mut sections: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut open: Option<(&str, Vec<&str>)> = None;
    for line in stdout.lines() {
        if let Some((name, lines)) = &mut open {
            if line.strip_prefix("end ") == Some(*name) {
                if let Some((name, lines)) = open.take() {
                    sections.insert(name, lines);
                }
            } else {
                lines.push(line);
            }
        } else if let Some(name) = line.strip_prefix("begin ") {
            open = Some((name, Vec::new()));
        } else if let Some((key, value)) = line.split_once('=') {
            values.entry(key).or_insert(value);
        }
    }
    facts.path = values.get("path").map(|p| p.to_string());
    facts.torchrun = match (values.get("torchrun"), values.get("torchrun-missing")) {
        (Some(path), _) => Torchrun::Found {
            path: path.to_string(),
        },
        (None, Some(name)) => Torchrun::Missing {
            name: name.to_string(),
            venv: values.get("torchrun-venv").map(|v| v.to_string()),
        },
        (None, None) => Torchrun::Unknown,
    };
    facts.python = python_facts(
        values.get("python").copied(),
        values.get("python-status").copied(),
        sections
            .get("python")
            .map(Vec::as_slice)
            .unwrap_or_default(),
    );
    facts.gpus = gpus(
        values.contains_key("nvidia-smi-missing"),
        values.get("nvidia-smi-status").copied(),
        sections
            .get("nvidia-smi")
            .map(Vec::as_slice)
            .unwrap_or_default(),
    );
    facts.nccl = sections
        .get("nccl")
        .into_iter()
        .flatten()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    facts.clock = values
        .get("clock")
        .and_then(|c| parse_clock(c))
        .map(|node| ClockSkew {
            seconds: node - clock_midpoint.0,
            uncertainty_seconds: clock_midpoint.1,
        });
    facts.disk = disk(
        values.get("disk-dir").copied(),
        values.get("disk-writable").copied(),
        sections.get("df").map(Vec::as_slice).unwrap_or_default(),
    );
    facts
}

/// `date +%s.%N`: seconds since the epoch (a `date` without `%N` prints it literally).
fn parse_clock(text: &str) -> Option<f64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let whole: f64 = whole.trim().parse().ok()?;
    let fraction = match fraction.trim() {
        f if !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()) => {
            format!("0.{f}").parse().unwrap_or(0.0)
        }
        _ => 0.0,
    };
    Some(whole + fraction)
}

fn python_facts(executable: Option<&str>, status: Option<&str>, output: &[&str]) -> PythonFacts {
    let mut facts = PythonFacts {
        executable: executable.map(str::to_string),
        ..PythonFacts::default()
    };
    if executable.is_none() {
        return facts;
    }
    let json = output.iter().find_map(|l| l.strip_prefix("facts="));
    let value: Option<serde_json::Value> = json.and_then(|j| serde_json::from_str(j).ok());
    let Some(value) = value.filter(|_| status == Some("0")) else {
        let last = output
            .iter()
            .rev()
            .map(|l| l.trim())
            .find(|l| !l.is_empty());
        facts.error = Some(match last {
            Some(line) => line.to_string(),
            None => format!("it exited with status {}", status.unwrap_or("unknown")),
        });
        return facts;
    };
    let text = |key: &str| value.get(key).and_then(|v| v.as_str()).map(str::to_string);
    facts.version = text("python");
    facts.torch = text("torch");
    facts.torch_error = text("torch_error");
    facts.cuda = text("cuda");
    facts.cuda_devices = value
        .get("cuda_devices")
        .and_then(|v| v.as_u64())
        .and_then(|n| u32::try_from(n).ok());
    facts.megatron_core = text("megatron_core");
    facts
}

fn gpus(missing: bool, status: Option<&str>, output: &[&str]) -> Gpus {
    if missing {
        return Gpus::NoNvidiaSmi;
    }
    let Some(status) = status else {
        return Gpus::Unknown;
    };
    let last = || {
        output
            .iter()
            .rev()
            .map(|l| l.trim())
            .find(|l| !l.is_empty())
            .unwrap_or("no output")
            .to_string()
    };
    if status != "0" {
        return Gpus::Failed {
            why: format!("exit status {status}: {}", last()),
        };
    }
    match parse_gpu_query(&output.join("\n")) {
        Ok(records) => Gpus::Listed {
            gpus: records
                .into_iter()
                .map(|g| Gpu {
                    name: g.name,
                    memory_bytes: g.memory_bytes,
                })
                .collect(),
        },
        Err(e) => Gpus::Failed {
            why: format!("its GPU list cannot be read: {e}"),
        },
    }
}

/// `df -Pk DIR`: the fourth field of its second line is the space available, in KiB.
fn disk(dir: Option<&str>, writable: Option<&str>, df: &[&str]) -> Disk {
    let Some(dir) = dir else {
        return Disk::Unknown;
    };
    let available = df
        .get(1)
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|kib| kib.parse::<u64>().ok());
    match available {
        Some(kib) => Disk::Known {
            dir: dir.to_string(),
            free_bytes: kib.saturating_mul(1024),
            writable: writable == Some("yes"),
        },
        None => Disk::Failed {
            why: format!(
                "`df -Pk {dir}` said {:?}",
                df.iter()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or(&"")
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe's output on the test machine (the venv's torchrun, no GPUs), shortened.
    const CPU_NODE: &str = "clock=1795530304.667204002
path=/venv/bin:/usr/bin:/bin
torchrun=/venv/bin/torchrun
python=/venv/bin/python
python-status=0
begin python
facts={\"python\": \"3.12.1\", \"executable\": \"/venv/bin/python\", \"torch\": \"2.9.0+cpu\", \"cuda\": null, \"cuda_devices\": 0, \"megatron_core\": \"0.19.2\"}
end python
nvidia-smi-missing=nvidia-smi
begin nccl
NCCL_DEBUG=INFO
NCCL_SOCKET_IFNAME==eth0
end nccl
disk-dir=/work
disk-writable=yes
begin df
Filesystem     1024-blocks     Used Available Capacity Mounted on
/dev/vda         264212084 74877004  20408884      79% /
end df
";

    #[test]
    fn a_cpu_node_reads_whole() {
        let facts = parse_probe_output("n1", CPU_NODE, (1795530304.0, 0.25));
        assert!(facts.reached());
        assert_eq!(facts.path.as_deref(), Some("/venv/bin:/usr/bin:/bin"));
        assert_eq!(
            facts.torchrun,
            Torchrun::Found {
                path: "/venv/bin/torchrun".into()
            }
        );
        assert_eq!(facts.python.version.as_deref(), Some("3.12.1"));
        assert_eq!(facts.python.torch.as_deref(), Some("2.9.0+cpu"));
        assert_eq!(facts.python.cuda, None);
        assert_eq!(facts.python.megatron_core.as_deref(), Some("0.19.2"));
        assert_eq!(facts.python.error, None);
        assert_eq!(facts.gpus, Gpus::NoNvidiaSmi);
        assert_eq!(facts.nccl.len(), 2);
        assert_eq!(facts.nccl["NCCL_SOCKET_IFNAME"], "=eth0");
        let clock = facts.clock.unwrap();
        assert!((clock.seconds - 0.667204002).abs() < 1e-3, "{clock:?}");
        assert_eq!(clock.uncertainty_seconds, 0.25);
        assert_eq!(
            facts.disk,
            Disk::Known {
                dir: "/work".into(),
                free_bytes: 20408884 * 1024,
                writable: true
            }
        );
    }

    #[test]
    fn gpus_missing_tools_and_broken_pythons_read_as_such() {
        let out = "clock=100\ntorchrun-missing=torchrun\npython=/usr/bin/python3\npython-status=1\n\
                   begin python\nTraceback (most recent call last):\nSyntaxError: invalid syntax\nend python\n\
                   nvidia-smi=/usr/bin/nvidia-smi\nnvidia-smi-status=0\nbegin nvidia-smi\n\
                   0, NVIDIA H100 80GB HBM3, 81559, 00000000:18:00.0\n1, NVIDIA H100 80GB HBM3, 81559, 00000000:2A:00.0\nend nvidia-smi\n";
        let facts = parse_probe_output("n2", out, (99.0, 0.5));
        assert_eq!(
            facts.torchrun,
            Torchrun::Missing {
                name: "torchrun".into(),
                venv: None,
            }
        );
        assert_eq!(
            facts.python.error.as_deref(),
            Some("SyntaxError: invalid syntax")
        );
        let Gpus::Listed { gpus } = &facts.gpus else {
            panic!("{:?}", facts.gpus)
        };
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].name, "NVIDIA H100 80GB HBM3");
        assert_eq!(gpus[0].memory_bytes, 81559 << 20);
        assert_eq!(facts.clock.unwrap().seconds, 1.0);
        assert_eq!(facts.disk, Disk::Unknown);

        let out = "clock=1.%N\nnvidia-smi=/usr/bin/nvidia-smi\nnvidia-smi-status=9\nbegin nvidia-smi\n\
                   NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\nend nvidia-smi\n\
                   python-missing=\ndisk-dir=/\nbegin df\ndf: /: No such file\nend df\n";
        let facts = parse_probe_output("n3", out, (1.0, 0.0));
        assert_eq!(facts.clock.unwrap().seconds, 0.0, "a date without %N");
        assert!(
            matches!(&facts.gpus, Gpus::Failed { why } if why.starts_with("exit status 9: NVIDIA-SMI has failed")),
            "{:?}",
            facts.gpus
        );
        assert_eq!(facts.python, PythonFacts::default());
        assert!(matches!(facts.disk, Disk::Failed { .. }));
    }

    #[test]
    fn a_venv_s_torchrun_off_the_path_is_read() {
        let out = "clock=100.0\npath=/usr/bin\ntorchrun-missing=torchrun\n\
                   torchrun-venv=/v/bin/torchrun\npython=/v/bin/python3\n";
        let facts = parse_probe_output("n1", out, (100.0, 0.0));
        assert_eq!(
            facts.torchrun,
            Torchrun::Missing {
                name: "torchrun".into(),
                venv: Some("/v/bin/torchrun".into()),
            }
        );
        assert_eq!(facts.python.executable.as_deref(), Some("/v/bin/python3"));
    }
}
