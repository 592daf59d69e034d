//! The benchmark suite's quick mode, as a smoke test: it must run against plain storage and
//! veilfs and produce well-formed outputs (results.json, results.md, chart.png). It checks
//! structure, never timings (benchmarks are never judged inside `cargo test`).

mod common;
use common::*;

#[test]
fn bench_quick_mode_produces_well_formed_outputs() {
    if !root_only("bench/run mounts a tmpfs as backing store") || !fuse_available() {
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let out = tempfile::tempdir().unwrap();
    let o = std::process::Command::new("python3")
        .args([&format!("{root}/bench/run"), "--quick", "--fs", "plain,veilfs", "--backing", "tmpfs", "--out"])
        .arg(out.path())
        .env("VEILFS_BIN", &BIN)
        .current_dir(root)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "bench/run --quick failed: {}", text(&o));
    let o = std::process::Command::new("python3")
        .args([&format!("{root}/bench/check_outputs.py")])
        .arg(out.path())
        .args(["--expect-fs", "plain,veilfs", "--expect-backing", "tmpfs"])
        .output()
        .unwrap();
    assert!(o.status.success(), "outputs are not well-formed: {}", text(&o));
    // veilfs itself must have mounted and produced numbers in every group, not only errors.
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    let runs = json["runs"].as_array().expect("runs");
    let veil: Vec<_> = runs.iter().filter(|r| r["fs"] == "veilfs").collect();
    assert!(!veil.is_empty(), "no veilfs runs");
    for r in veil {
        let values = r["values"].as_object().expect("values");
        assert!(!values.is_empty() && values.values().all(|v| v.is_number()), "veilfs run without numbers: {r}");
        assert!(r["errors"].as_object().is_none_or(|e| e.is_empty()), "veilfs errors: {r}");
    }
}
