//! The site configuration file (issue 15 item 6) through the real binaries: found at
//! `$XDG_CONFIG_HOME/pipette/config.toml`, `PIPETTE_CONFIG` or `--config`; the command line
//! beats the environment, which beats the file, which beats the built-in default; `pipette
//! config show` says where each value comes from.

use std::path::{Path, PathBuf};

use assert_cmd::Command;

mod common;

use common::{json_report, report_hosts, TINY_MODEL};

fn cluster_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/clusters/a100-2x8.json")
}

/// A home whose `$XDG_CONFIG_HOME/pipette/config.toml` holds `text`.
fn site(text: &str) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("config/pipette");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.toml"), text).unwrap();
    home
}

fn command(bin: &str, home: &Path) -> Command {
    let mut cmd = Command::cargo_bin(bin).unwrap();
    cmd.env_clear()
        .current_dir(home)
        .env("XDG_CONFIG_HOME", home.join("config"));
    cmd
}

fn dry_run(home: &Path, args: &[&str]) -> serde_json::Value {
    let out = command("pipette-run", home)
        .args(args)
        .args(["--dry-run", "--json", "train.py"])
        .args(TINY_MODEL)
        .output()
        .unwrap();
    json_report(&out)
}

#[test]
fn the_file_sets_defaults_below_the_environment_and_the_command_line() {
    let cluster = cluster_file();
    let home = site(&format!(
        "cluster = {:?}\ninclude = \"a100-n01\"\nseed = 5\n",
        cluster.display().to_string()
    ));
    let h = home.path();
    assert_eq!(report_hosts(&dry_run(h, &[])), ["a100-n01"]);
    assert_eq!(
        report_hosts(&dry_run(h, &["--include", "a100-n00"])),
        ["a100-n00"]
    );
    // The environment beats the file: PIPETTE_HOSTS is not in the file, PIPETTE_SEED is.
    let shown = command("pipette", h)
        .env("PIPETTE_SEED", "9")
        .args(["config", "show"])
        .output()
        .unwrap();
    assert!(shown.status.success());
    let shown = String::from_utf8(shown.stdout).unwrap();
    assert!(shown.contains("include = \"a100-n01\"  # file"), "{shown}");
    assert!(
        shown.contains("seed = \"9\"  # environment PIPETTE_SEED"),
        "{shown}"
    );
    assert!(shown.contains("grace = \"10s\"  # built-in"), "{shown}");
}

/// `pipette calibrate` runs a pipette-run job's trial: the file gives its options'
/// defaults with the same precedence (issue 15: it ignored the file).
#[test]
fn the_file_applies_to_pipette_calibrate() {
    let cluster = cluster_file();
    let home = site(&format!(
        "cluster = {:?}\ninclude = \"a100-n01\"\nmaster-port = 29511\n",
        cluster.display().to_string()
    ));
    let torchrun = common::torchrun();
    let path = format!("{}:/usr/bin:/bin", torchrun.parent().unwrap().display());
    let calibrate = |args: &[&str], env: &[(&str, &str)]| {
        let out = command("pipette", home.path())
            .env("PATH", &path)
            .envs(env.iter().copied())
            .args(["calibrate", "--out", "c.json"])
            .args(args)
            .args(["--dry-run", "train.py"])
            .args(TINY_MODEL)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let from_file = calibrate(&[], &[]);
    assert!(
        from_file.contains("# node rank 0 (a100-n01)"),
        "{from_file}"
    );
    assert!(!from_file.contains("a100-n00"), "{from_file}");
    assert!(from_file.contains("'--master-port=29511'"), "{from_file}");
    // The environment beats the file, the command line beats both.
    let from_env = calibrate(&[], &[("PET_MASTER_PORT", "29522")]);
    assert!(from_env.contains("'--master-port=29522'"), "{from_env}");
    let from_line = calibrate(
        &["--include", "a100-n00", "--master-port", "29533"],
        &[("PET_MASTER_PORT", "29522")],
    );
    assert!(
        from_line.contains("# node rank 0 (a100-n00)"),
        "{from_line}"
    );
    assert!(from_line.contains("'--master-port=29533'"), "{from_line}");
}

#[test]
fn config_and_pipette_config_name_the_file() {
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("site.toml");
    std::fs::write(&file, "include = \"a100-n00\"\n").unwrap();
    let cluster = cluster_file();
    let cluster = cluster.to_str().unwrap();
    let via_flag = dry_run(
        home.path(),
        &["--config", file.to_str().unwrap(), "--cluster", cluster],
    );
    assert_eq!(report_hosts(&via_flag), ["a100-n00"]);
    let out = command("pipette-run", home.path())
        .env("PIPETTE_CONFIG", &file)
        .args(["--cluster", cluster, "--dry-run", "--json", "train.py"])
        .args(TINY_MODEL)
        .output()
        .unwrap();
    assert_eq!(report_hosts(&json_report(&out)), ["a100-n00"]);
}

#[test]
fn a_bad_file_is_one_line_naming_it_and_exit_2() {
    let home = site("clusters = \"x\"\n");
    let out = command("pipette-run", home.path())
        .args(["--dry-run", "train.py"])
        .args(TINY_MODEL)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("config.toml: \"clusters\" is not a pipette-run option"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
