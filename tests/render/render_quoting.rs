//! Nothing a user or a host supplies is interpreted by a shell: host names, arguments,
//! the script's name, the working directory, the rendezvous id and forwarded variables
//! with spaces, quotes, `$`, `;`, backticks, backslashes, newlines and Unicode arrive in
//! the launched process byte-for-byte.
//!
//! Each case renders a launch with random values, writes the run directory, runs every
//! node's script under bash with torchrun replaced by a program that writes its argv and
//! environment NUL-separated, and compares what arrived with what was meant, which the
//! test writes down itself (not taken from the render). A canary argument that would
//! create a file if any shell expanded it proves nothing ran.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use pipette::config::settings_from_megatron_args;
use pipette::exec::shell_quote;
use pipette::model::parallel::ParallelConfig;
use pipette::render::{render, write_run_dir, RenderInput, ScriptInvocation, Templates};
use proptest::prelude::*;

const ARGS: &str = "--num-layers 8 --hidden-size 64 --num-attention-heads 8 --seq-length 32 \
                    --max-position-embeddings 32 --vocab-size 100 --global-batch-size 96";

/// Text a shell would love to interpret, and some that is merely unusual.
const NASTY: &str = "[a-zA-Z0-9 $;`'\"\\\\\n\t*?{}()<>|&!#~=%^,.:@/é漢🦀-]";

fn nasty(max: usize) -> impl Strategy<Value = String> {
    proptest::string::string_regex(&format!("{NASTY}{{1,{max}}}")).unwrap()
}

/// A user argument: a plain word, or an option of the script's own (`--` and text), never
/// `--` alone nor one of the options the plan replaces.
fn user_arg() -> impl Strategy<Value = String> {
    prop_oneof![
        nasty(16).prop_filter("not the end of options", |s| s != "--"),
        nasty(12).prop_map(|s| format!("--user-{s}")),
    ]
}

fn fake_torchrun(dir: &Path) -> String {
    let path = dir.join("fake-torchrun");
    let argv = shell_quote(&dir.join("argv").display().to_string());
    let env = shell_quote(&dir.join("env").display().to_string());
    common::write_executable(&path, &format!(
            "#!/usr/bin/env bash\nprintf '%s\\0' \"$@\" > {argv}\n\
             printf '%s\\0' \"$PWD\" \"$CUDA_VISIBLE_DEVICES\" \"$PIPETTE_HOST\" \"$NCCL_TEST_VALUE\" > {env}\n"
        ));
    path.display().to_string()
}

fn nul_separated(path: &Path) -> Vec<String> {
    let text = String::from_utf8(std::fs::read(path).unwrap()).unwrap();
    let mut fields: Vec<String> = text.split('\0').map(str::to_string).collect();
    assert_eq!(fields.pop().as_deref(), Some(""));
    fields
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn values_arrive_byte_for_byte(
        hosts in proptest::collection::btree_set(nasty(12), 1..=3),
        user_args in proptest::collection::vec(user_arg(), 0..6),
        program in nasty(12),
        workdir_name in nasty(12).prop_filter("a directory name", |n| {
            !n.contains('/') && n != "." && n != ".."
        }),
        rdzv_id in nasty(10),
        nccl_value in nasty(16),
        port in 1024u16..,
    ) {
        let hosts: Vec<String> = hosts.into_iter().collect();
        let dir = tempfile::tempdir().unwrap();
        let workdir = dir.path().join(&workdir_name);
        std::fs::create_dir(&workdir).unwrap();
        let canary = dir.path().join("canary");
        let canary_arg = format!(
            "$(touch {c}); `touch {c}`; touch {c}",
            c = canary.display()
        );

        let settings = settings_from_megatron_args(&common::words(ARGS), None, &[]).unwrap();
        let config = ParallelConfig::even(8, 1, 1, 2 * hosts.len() as u64, 1);
        let cvd: BTreeMap<String, Vec<u32>> =
            hosts.iter().map(|h| (h.clone(), vec![1, 0])).collect();
        let mut script_args = common::words(ARGS);
        script_args.extend(user_args.iter().cloned());
        script_args.push(canary_arg.clone());
        let program = format!("./{program}");
        let mut input = RenderInput::new(
            &settings,
            ScriptInvocation::python(program.clone(), script_args.clone()),
            &config,
            &hosts,
            &cvd,
        );
        input.torchrun = fake_torchrun(dir.path());
        input.workdir = workdir.display().to_string();
        input.rdzv_id = rdzv_id.clone();
        input.master_port = port;
        input.env.insert("NCCL_TEST_VALUE".into(), nccl_value.clone());
        let run_dir = dir.path().join("run");
        input.run_dir = run_dir.display().to_string();
        let spec = render(&input, &Templates::embedded()).unwrap();
        write_run_dir(&spec, &run_dir).unwrap();

        for node in &spec.nodes {
            let script = run_dir.join(&node.script_path);
            let out = Command::new("bash").arg(&script).output().unwrap();
            prop_assert!(out.status.success(), "{}: {}", script.display(),
                String::from_utf8_lossy(&out.stderr));
            let argv = nul_separated(&dir.path().join("argv"));
            // What was meant, written down here.
            let mut expected = vec![
                format!("--nnodes={}", hosts.len()),
                "--nproc-per-node=2".to_string(),
                format!("--node-rank={}", node.node_rank),
                "--rdzv-backend=static".to_string(),
                format!("--rdzv-id={rdzv_id}"),
                format!("--master-addr={}", hosts[0]),
                format!("--master-port={port}"),
                program.clone(),
            ];
            expected.extend(script_args.iter().cloned());
            expected.extend(common::words(
                "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 \
                 --micro-batch-size 1",
            ));
            prop_assert_eq!(&argv, &expected);
            prop_assert_eq!(&argv[..], &node.argv[1..]);

            // The one-line form --dry-run prints runs the same command.
            let line = &spec.command_lines()[node.node_rank as usize];
            let out = Command::new("bash").arg("-c").arg(line).output().unwrap();
            prop_assert!(out.status.success());
            prop_assert_eq!(&nul_separated(&dir.path().join("argv")), &expected);

            let env = nul_separated(&dir.path().join("env"));
            let pwd = Path::new(&env[0]).canonicalize().unwrap();
            prop_assert_eq!(pwd, workdir.canonicalize().unwrap());
            prop_assert_eq!(&env[1], "1,0");
            prop_assert_eq!(&env[2], &hosts[node.node_rank as usize]);
            prop_assert_eq!(&env[3], &nccl_value);
        }
        // megatron-args.txt reads back into the same words, as its header says.
        let out = Command::new("bash")
            .arg("-c")
            .arg("eval \"args=($(< \"$1\"))\"; printf '%s\\0' \"${args[@]}\"")
            .arg("bash")
            .arg(run_dir.join("megatron-args.txt"))
            .output()
            .unwrap();
        prop_assert!(out.status.success());
        let mut read_back: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .split('\0')
            .map(str::to_string)
            .collect();
        read_back.pop();
        prop_assert_eq!(&read_back, &spec.megatron_args);
        prop_assert!(!canary.exists(), "a shell expanded an argument");
    }
}
