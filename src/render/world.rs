//! The launch of a script pipette-run does not plan: exactly what torchrun would run on
//! each node — the world (nodes × workers per node, node ranks in the order given, the
//! rank-0 node as master) with the static rendezvous, the user's torchrun options, and the
//! script's arguments untouched. No GPU mapping (`CUDA_VISIBLE_DEVICES` is left as the
//! node has it), no Megatron arguments, no DeepSpeed files: only the launch scripts and
//! `world.json`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    check_nodes, check_values, node_env, LaunchSpec, LaunchValues, NodeCommon, RenderError,
    RunFile, ScriptInvocation, Templates, TorchrunSpelling,
};

/// Everything [`render_world`] needs.
#[derive(Debug, Clone)]
pub struct WorldInput<'a> {
    /// The user's script, its arguments as given.
    pub script: ScriptInvocation,
    /// Node rank → host.
    pub node_order: &'a [String],
    pub nproc_per_node: u64,
    /// The rank-0 node's address; default `node_order[0]`.
    pub master_addr: Option<String>,
    pub master_port: u16,
    pub rdzv_id: String,
    pub torchrun: String,
    pub torchrun_passthrough: Vec<String>,
    pub torchrun_spelling: TorchrunSpelling,
    /// Environment for every node (see [`super::forwarded_env`]).
    pub env: BTreeMap<String, String>,
    pub workdir: String,
    pub run_dir: String,
    /// Why the job is not planned, written into `world.json`.
    pub planning_off: String,
}

/// `world.json`: the layout of an unplanned job.
#[derive(Serialize)]
struct WorldFile<'a> {
    planning: &'static str,
    why: &'a str,
    nodes: &'a [String],
    nproc_per_node: u64,
    world_size: u64,
}

/// The launch of `input`'s world: per-node torchrun commands and scripts. Pure.
pub fn render_world(
    input: &WorldInput<'_>,
    templates: &Templates,
) -> Result<LaunchSpec, RenderError> {
    let nproc = input.nproc_per_node;
    check_nodes(input.node_order, nproc)?;
    check_values(&LaunchValues {
        node_order: input.node_order,
        script: &input.script,
        torchrun: &input.torchrun,
        torchrun_passthrough: &input.torchrun_passthrough,
        rdzv_id: &input.rdzv_id,
        workdir: &input.workdir,
        run_dir: &input.run_dir,
        master_addr: input.master_addr.as_deref(),
        env: &input.env,
    })?;
    let master_addr = input
        .master_addr
        .clone()
        .unwrap_or_else(|| input.node_order[0].clone());
    let nnodes = input.node_order.len();
    let world_size = nnodes as u64 * nproc;
    let common = NodeCommon {
        nnodes,
        nproc_per_node: nproc,
        master_addr: &master_addr,
        master_port: input.master_port,
        rdzv_id: &input.rdzv_id,
        torchrun: &input.torchrun,
        passthrough: &input.torchrun_passthrough,
        spelling: input.torchrun_spelling,
        script: &input.script,
        script_args: &input.script.args,
        workdir: &input.workdir,
        run_dir: &input.run_dir,
    };
    let mut nodes = Vec::new();
    let mut files = Vec::new();
    for (node_rank, host) in input.node_order.iter().enumerate() {
        let env = node_env(host, None, &[], &input.env);
        let (node, file) = common.node(node_rank, host, Vec::new(), env, templates)?;
        nodes.push(node);
        files.push(file);
    }
    let world = WorldFile {
        planning: "off",
        why: &input.planning_off,
        nodes: input.node_order,
        nproc_per_node: nproc,
        world_size,
    };
    files.push(RunFile {
        path: "world.json".into(),
        contents: format!(
            "{}\n",
            serde_json::to_string_pretty(&world)
                .map_err(|e| RenderError::Plan(format!("the world is not JSON: {e}")))?
        ),
        executable: false,
    });
    Ok(LaunchSpec {
        megatron_args: input.script.args.clone(),
        nodes,
        master_addr,
        master_port: input.master_port,
        rdzv_id: input.rdzv_id.clone(),
        nproc_per_node: nproc,
        world_size,
        deepspeed: false,
        notes: Vec::new(),
        workdir: input.workdir.clone(),
        run_dir: input.run_dir.clone(),
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    fn input<'a>(hosts: &'a [String], args: &str) -> WorldInput<'a> {
        WorldInput {
            script: ScriptInvocation::python("ddp.py", w(args)),
            node_order: hosts,
            nproc_per_node: 2,
            master_addr: None,
            master_port: 29400,
            rdzv_id: "job9".into(),
            torchrun: "torchrun".into(),
            torchrun_passthrough: w("--max-restarts=1 --nnodes=9"),
            torchrun_spelling: TorchrunSpelling::Dashes,
            env: BTreeMap::from([("NCCL_DEBUG".to_string(), "INFO".to_string())]),
            workdir: "/w".into(),
            run_dir: "/w/run".into(),
            planning_off: "planning is off".into(),
        }
    }

    #[test]
    fn the_world_runs_the_script_as_torchrun_would() {
        let hosts = w("b a");
        // Megatron-looking and DeepSpeed arguments stay exactly as given.
        let args = "--lr 0.1 --micro-batch-size 3 --deepspeed_config ds.json -- --x";
        let spec = render_world(&input(&hosts, args), &Templates::embedded()).unwrap();
        assert_eq!(spec.world_size, 4);
        assert_eq!(spec.master_addr, "b");
        assert_eq!(spec.megatron_args, w(args));
        assert_eq!(spec.nodes[1].host, "a");
        assert_eq!(spec.nodes[1].first_rank, 2);
        assert_eq!(
            spec.nodes[1].argv,
            w(
                "torchrun --nnodes=2 --nproc-per-node=2 --node-rank=1 --rdzv-backend=static \
               --rdzv-id=job9 --master-addr=b --master-port=29400 --max-restarts=1 ddp.py"
            )
            .into_iter()
            .chain(w(args))
            .collect::<Vec<_>>()
        );
        // No GPU mapping: the node's own CUDA_VISIBLE_DEVICES stays.
        assert_eq!(
            spec.nodes[0].env,
            [
                ("NCCL_DEBUG".to_string(), "INFO".to_string()),
                ("PIPETTE_HOST".to_string(), "b".to_string())
            ]
        );
        let paths: Vec<&str> = spec.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["launch-0-b.sh", "launch-1-a.sh", "world.json"]);
        let world: serde_json::Value = serde_json::from_str(&spec.files[2].contents).unwrap();
        assert_eq!(world["world_size"], 4);
        assert_eq!(world["planning"], "off");
    }

    #[test]
    fn an_empty_or_doubled_world_is_a_bug_and_nul_is_refused() {
        let t = Templates::embedded();
        let none: Vec<String> = Vec::new();
        assert!(render_world(&input(&none, ""), &t).unwrap_err().is_bug());
        let twice = w("a a");
        assert!(render_world(&input(&twice, ""), &t).unwrap_err().is_bug());
        let hosts = w("a");
        let mut nul = input(&hosts, "");
        nul.script.args.push("a\0b".into());
        assert!(matches!(
            render_world(&nul, &t),
            Err(RenderError::Unrepresentable { .. })
        ));
    }
}
