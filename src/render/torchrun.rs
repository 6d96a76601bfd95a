//! The torchrun command line of one node: static rendezvous, the plan's node rank, and
//! the option spellings the installed torchrun understands.

use serde::{Deserialize, Serialize};

use super::ScriptInvocation;
use crate::config::megatron::argparse::words_by;
use crate::config::megatron::options::Arity;

/// How the installed torchrun spells its options. Current torchrun accepts both
/// `--nproc-per-node` and `--nproc_per_node`; old releases (PyTorch 1.x) only the
/// underscores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TorchrunSpelling {
    #[default]
    Dashes,
    Underscores,
}

impl TorchrunSpelling {
    /// The spelling a torchrun needs, from its `--help` output: underscores when it lists
    /// `--nproc_per_node` but not `--nproc-per-node`, dashes otherwise.
    pub fn from_help(help: &str) -> Self {
        if help.contains("--nproc_per_node") && !help.contains("--nproc-per-node") {
            TorchrunSpelling::Underscores
        } else {
            TorchrunSpelling::Dashes
        }
    }

    /// `--NAME` for an option named with dashes (`nproc-per-node`).
    pub fn option(self, dashed: &str) -> String {
        match self {
            TorchrunSpelling::Dashes => format!("--{dashed}"),
            TorchrunSpelling::Underscores => format!("--{}", dashed.replace('-', "_")),
        }
    }

    /// `--NAME=VALUE`.
    pub fn option_value(self, dashed: &str, value: &str) -> String {
        format!("{}={value}", self.option(dashed))
    }
}

/// torchrun options pipette-run writes itself from the plan; a copy in the pass-through
/// options is dropped so the plan's value is the only one.
const PLANNED: &[&str] = &[
    "nnodes",
    "nproc-per-node",
    "node-rank",
    "master-addr",
    "master-port",
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-id",
    "standalone",
    // How SCRIPT is run comes from the ScriptInvocation.
    "module",
    "no-python",
    "run-path",
];

/// Options among [`PLANNED`] that take no value.
const PLANNED_FLAGS: &[&str] = &["standalone", "module", "no-python", "run-path"];

/// The user's torchrun options without those the plan decides, in `spelling`.
/// Long options are respelled (`--max-restarts=3` → `--max_restarts=3`); short options
/// and separate values are kept as they are.
pub fn passthrough(options: &[String], spelling: TorchrunSpelling) -> Vec<String> {
    let planned = |name: &str| PLANNED.contains(&name);
    let arity = |name: &str| match planned(name) && !PLANNED_FLAGS.contains(&name) {
        true => Arity::Value,
        false => Arity::Flag,
    };
    let mut out = Vec::new();
    for word in words_by(options, arity) {
        match word.name.as_deref() {
            Some(name) if planned(name) => {}
            Some(name) => out.push(match &word.inline_value {
                Some(value) => spelling.option_value(name, value),
                None => spelling.option(name),
            }),
            None if options[word.start] == "-m" => {}
            None => out.extend_from_slice(&options[word.start..word.end]),
        }
    }
    out
}

/// Where this node sits in the job and how to reach the rank-0 node.
#[derive(Debug, Clone)]
pub(crate) struct NodeCoordinates<'a> {
    pub nnodes: usize,
    pub nproc_per_node: u64,
    pub node_rank: usize,
    pub master_addr: &'a str,
    pub master_port: u16,
    pub rdzv_id: &'a str,
}

/// The full argv of torchrun on one node: `torchrun`, the static-rendezvous options, the
/// user's other torchrun options, how to run SCRIPT, SCRIPT and its arguments.
pub(crate) fn argv(
    torchrun: &str,
    at: &NodeCoordinates<'_>,
    passthrough_options: &[String],
    spelling: TorchrunSpelling,
    script: &ScriptInvocation,
    script_args: &[String],
) -> Vec<String> {
    let s = spelling;
    let mut argv = vec![
        torchrun.to_string(),
        s.option_value("nnodes", &at.nnodes.to_string()),
        s.option_value("nproc-per-node", &at.nproc_per_node.to_string()),
        s.option_value("node-rank", &at.node_rank.to_string()),
        s.option_value("rdzv-backend", "static"),
        s.option_value("rdzv-id", at.rdzv_id),
        s.option_value("master-addr", at.master_addr),
        s.option_value("master-port", &at.master_port.to_string()),
    ];
    argv.extend(passthrough(passthrough_options, spelling));
    if script.module {
        argv.push("-m".to_string());
    }
    if script.no_python {
        argv.push(s.option("no-python"));
    }
    if script.run_path {
        argv.push(s.option("run-path"));
    }
    argv.push(script.program.clone());
    argv.extend(script_args.iter().cloned());
    argv
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn spelling_from_help() {
        let new = "usage: torchrun [-h] [--nnodes NNODES] [--nproc-per-node NPROC_PER_NODE]";
        let both = "  --nproc-per-node NPROC_PER_NODE, --nproc_per_node NPROC_PER_NODE";
        let old = "usage: torchrun [-h] [--nnodes NNODES] [--nproc_per_node NPROC_PER_NODE]";
        assert_eq!(TorchrunSpelling::from_help(new), TorchrunSpelling::Dashes);
        assert_eq!(TorchrunSpelling::from_help(both), TorchrunSpelling::Dashes);
        assert_eq!(
            TorchrunSpelling::from_help(old),
            TorchrunSpelling::Underscores
        );
        assert_eq!(TorchrunSpelling::from_help(""), TorchrunSpelling::Dashes);
        assert_eq!(
            TorchrunSpelling::Underscores.option_value("master-addr", "a-b"),
            "--master_addr=a-b"
        );
    }

    #[test]
    fn passthrough_drops_planned_options_and_respells() {
        let options = words(
            "--max-restarts=3 --nnodes 4 --node_rank=2 -m --standalone --log-dir=/x \
             --master-port 1234 --tee 3 --no-python --redirects=2",
        );
        assert_eq!(
            passthrough(&options, TorchrunSpelling::Dashes),
            words("--max-restarts=3 --log-dir=/x --tee 3 --redirects=2")
        );
        assert_eq!(
            passthrough(&options, TorchrunSpelling::Underscores),
            words("--max_restarts=3 --log_dir=/x --tee 3 --redirects=2")
        );
    }

    #[test]
    fn argv_in_both_spellings() {
        let at = NodeCoordinates {
            nnodes: 2,
            nproc_per_node: 8,
            node_rank: 1,
            master_addr: "n0",
            master_port: 29500,
            rdzv_id: "77",
        };
        let script = ScriptInvocation {
            program: "pretrain_gpt.py".into(),
            module: false,
            no_python: true,
            run_path: false,
            args: vec![],
        };
        let dashed = argv(
            "torchrun",
            &at,
            &[],
            TorchrunSpelling::Dashes,
            &script,
            &words("--x 1"),
        );
        assert_eq!(
            dashed,
            words(
                "torchrun --nnodes=2 --nproc-per-node=8 --node-rank=1 --rdzv-backend=static \
                 --rdzv-id=77 --master-addr=n0 --master-port=29500 --no-python pretrain_gpt.py --x 1"
            )
        );
        let old = argv(
            "torchrun",
            &at,
            &[],
            TorchrunSpelling::Underscores,
            &script,
            &[],
        );
        assert_eq!(
            old,
            words(
                "torchrun --nnodes=2 --nproc_per_node=8 --node_rank=1 --rdzv_backend=static \
                 --rdzv_id=77 --master_addr=n0 --master_port=29500 --no_python pretrain_gpt.py"
            )
        );
    }
}
