//! A slow node is profiled, not refused (issue 17): `pipette profile` on a node whose
//! measured matmul throughput is below the old 0.001 TFLOPS floor (what a loaded 2-core
//! machine measured) writes the profile with the figure kept, notes it as slow in the file,
//! and says so. A stand-in torchrun plays the probe and prints the report a real probe
//! prints, so the figure is the same on any machine.

use crate::common;

use std::path::Path;

use assert_cmd::Command;
use pipette::cluster::ClusterProfile;

/// A torchrun that prints one probe report: one node, one CPU process, slow matmuls.
fn slow_torchrun(dir: &Path) -> std::path::PathBuf {
    let report = r#"{"protocol": 2, "backend": "gloo", "torch": "2.5.1", "world_size": 1, "sizes": [65536], "warmup": 1, "repeats": 3, "ranks": [{"rank": 0, "node": 0, "local_rank": 0, "hostname": "localhost", "device": "cpu", "name": "cpu", "host_memory_bytes": 8589934592, "cpus": 2, "threads": 2}], "links": [], "compute": [{"rank": 0, "dtype": "fp32", "n": 256, "tflops": 0.00093238112051}, {"rank": 0, "dtype": "bf16", "n": 256, "tflops": 0.00041}], "elapsed_s": 3.0}"#;
    let path = dir.join("torchrun");
    common::write_executable(
        &path,
        &format!("#!/bin/sh\nprintf '%s\\n' 'PIPETTE-PROBE-RESULT {report}'\n"),
    );
    path
}

#[test]
fn pipette_profile_keeps_a_slow_node_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let torchrun = slow_torchrun(dir.path());
    let out = dir.path().join("profile.json");
    let assert = Command::cargo_bin("pipette")
        .unwrap()
        .args([
            "profile",
            "--hosts",
            "localhost",
            "--launcher",
            "local",
            "--torchrun",
        ])
        .arg(&torchrun)
        .arg("--out")
        .arg(&out)
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .env("PATH", "/usr/bin:/bin")
        .env_remove("SLURM_JOB_NODELIST")
        .env_remove("SLURM_NODELIST")
        .env_remove("PBS_NODEFILE")
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(
        stderr.contains(
            "pipette: slow: GPU 0 of localhost (cpu) computes 0.00041 TFLOPS, below 0.001 \
             TFLOPS, less than any working part attains (is the node loaded, throttled or \
             broken?) (nodes[0].gpus[0].measured_tflops[0].tflops)"
        ),
        "{stderr}"
    );

    let profile = ClusterProfile::load(&out).unwrap_or_else(|e| panic!("{e}"));
    let gpu = &profile.nodes[0].gpus().unwrap()[0];
    assert_eq!(
        gpu.peak_tflops.fp16, 0.00093238112051,
        "the best figure is kept"
    );
    let measured = gpu.measured_tflops.first().unwrap();
    assert_eq!(measured.tflops, 0.00041);
    let note = measured.provenance.note.as_deref().unwrap_or("");
    assert!(
        note.contains("; slow: GPU 0 of localhost (cpu) computes 0.00041 TFLOPS"),
        "{note}"
    );
    assert_eq!(profile.slow_parts().len(), 1);
}
