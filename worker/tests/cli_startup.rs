//! Start-up checks against the real binary (M0-W-1100, M0-W-1111,
//! M0-W-1700, M0-W-1701): bad flags exit 1 naming the flag, usage errors
//! exit 2, a bad model exits 1 with one complete ERROR record, and nothing
//! listens after a failed start.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

fn error_records(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["level"] == "ERROR")
        .collect()
}

#[test]
fn bad_flag_values_exit_1_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    let model = model.to_str().unwrap().to_string();
    let busy = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let busy_port = busy.local_addr().unwrap().port().to_string();
    let port = free_port().to_string();
    let missing = dir
        .path()
        .join("missing.gguf")
        .to_str()
        .unwrap()
        .to_string();
    let rows: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--worker-id",
                "not-a-uuid",
                "--model",
                &model,
                "--gpu-device",
                "0",
                "--port",
                &port,
            ],
            "--worker-id",
        ),
        (
            vec![
                "--worker-id",
                WORKER_ID,
                "--model",
                &missing,
                "--gpu-device",
                "0",
                "--port",
                &port,
            ],
            "--model",
        ),
        (
            vec![
                "--worker-id",
                WORKER_ID,
                "--model",
                "m.gguf",
                "--gpu-device",
                "0",
                "--port",
                &port,
            ],
            "--model",
        ),
        (
            vec![
                "--worker-id",
                WORKER_ID,
                "--model",
                &model,
                "--gpu-device",
                "0",
                "--port",
                "80",
            ],
            "--port",
        ),
        (
            vec![
                "--worker-id",
                WORKER_ID,
                "--model",
                &model,
                "--gpu-device",
                "0",
                "--port",
                &busy_port,
            ],
            "--port",
        ),
        (
            vec![
                "--worker-id",
                WORKER_ID,
                "--model",
                &model,
                "--gpu-device",
                "0",
                "--port",
                &port,
                "--max-tokens-out",
                "0",
            ],
            "--max-tokens-out",
        ),
    ];
    for (args, flag) in rows {
        let (status, stderr) = run_to_exit(&args);
        assert_eq!(status.code(), Some(1), "{args:?}\n{stderr}");
        let errors = error_records(&stderr);
        assert_eq!(errors.len(), 1, "one ERROR record: {stderr}");
        assert!(
            errors[0]["message"].as_str().unwrap().contains(flag),
            "{flag}: {stderr}"
        );
        assert_eq!(errors[0]["flag"], flag);
    }
    drop(busy);
}

#[test]
fn usage_errors_exit_2() {
    let (status, stderr) = run_to_exit(&["--no-such-flag"]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    let (status, stderr) = run_to_exit(&["--port", "abc"]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    let (status, stderr) = run_to_exit(&["--port", "9000"]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--worker-id"), "{stderr}");
    let (status, stderr) = run_to_exit(&["--backend", "tpu"]);
    assert_eq!(status.code(), Some(2), "{stderr}");
}

/// M0-W-1111, EXT-004: a file with a bad magic exits 1 with one ERROR record
/// holding code, message, GPU id and model path; nothing listens.
#[test]
fn a_bad_model_file_fails_the_start_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("bad.gguf");
    std::fs::write(
        &model,
        b"NOPE\x03\x00\x00\x00 and then some bytes that are not a model",
    )
    .unwrap();
    let port = free_port();
    let (status, stderr) = run_to_exit(&[
        "--worker-id",
        WORKER_ID,
        "--model",
        model.to_str().unwrap(),
        "--gpu-device",
        "0",
        "--port",
        &port.to_string(),
        "--backend",
        "cpu",
    ]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    let errors = error_records(&stderr);
    assert_eq!(errors.len(), 1, "{stderr}");
    let e = &errors[0];
    assert_eq!(e["event"], "error");
    assert_eq!(e["code"], "MODEL_LOAD_FAILED");
    assert!(e["message"].as_str().unwrap().len() > 5);
    assert_eq!(e["gpu_device"], 0);
    assert_eq!(e["model_path"], model.to_str().unwrap());
    assert!(std::net::TcpStream::connect_timeout(
        &([127, 0, 0, 1], port).into(),
        Duration::from_millis(200)
    )
    .is_err());
}

/// M0-W-1700: the default backend without a usable GPU exits 1 with the hint; no fallback.
#[test]
fn cuda_without_a_gpu_exits_1_with_a_hint() {
    let Some(model) = reference_model() else {
        return;
    };
    if std::path::Path::new("/dev/nvidia0").exists() {
        eprintln!("note: a GPU is present; skipping the no-GPU check");
        return;
    }
    let (status, stderr) = run_to_exit(&[
        "--worker-id",
        WORKER_ID,
        "--model",
        model.to_str().unwrap(),
        "--gpu-device",
        "0",
        "--port",
        &free_port().to_string(),
    ]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--backend cpu"), "{stderr}");
    let errors = error_records(&stderr);
    assert_eq!(errors.len(), 1, "{stderr}");
    assert_eq!(errors[0]["backend"], "cuda");
}

/// M0-W-1701: the YAML file supplies values, flags win, unknown keys exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaml_config_under_flags() {
    let Some(model) = reference_model() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("worker.yaml");
    let file_port = free_port();
    std::fs::write(
        &yaml,
        format!(
            "worker-id: {WORKER_ID}\nmodel: {}\ngpu-device: 0\nbackend: cpu\nport: {file_port}\nmax-tokens-out: 5\n",
            model.display()
        ),
    )
    .unwrap();
    let Some(w) = Worker::start(&["--config", yaml.to_str().unwrap()]).await else {
        return;
    };
    // Worker::start passes --port (a fresh one): the flag wins over the file.
    assert_ne!(w.port, file_port);
    let six = w
        .post(
            "/execute",
            serde_json::json!({"job_id": "j", "prompt": "hi", "max_tokens": 6}),
        )
        .await;
    assert_eq!(six.status(), 400, "max-tokens-out 5 came from the file");
    drop(w);

    std::fs::write(&yaml, "port: 9000\ncolour: blue\n").unwrap();
    let (status, stderr) = run_to_exit(&[
        "--config",
        yaml.to_str().unwrap(),
        "--worker-id",
        WORKER_ID,
        "--model",
        model.to_str().unwrap(),
        "--gpu-device",
        "0",
    ]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("colour"), "{stderr}");
}

/// M0-W-1111: a start that fails on a flag still logs the GPU and model it was given.
#[test]
fn the_failure_record_names_gpu_and_model() {
    let (status, stderr) = run_to_exit(&[
        "--worker-id",
        "nope",
        "--model",
        "/nowhere/m.gguf",
        "--gpu-device",
        "3",
        "--port",
        &free_port().to_string(),
    ]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    let errors = error_records(&stderr);
    assert_eq!(errors.len(), 1, "{stderr}");
    assert_eq!(errors[0]["gpu_device"], 3);
    assert_eq!(errors[0]["model_path"], "/nowhere/m.gguf");
    assert_eq!(errors[0]["code"], "INVALID_CONFIG");
}

/// `--log-format json` writes JSON records, `pretty` one line of text per
/// record with the same facts; without a terminal, the default is JSON.
#[test]
fn log_format_json_and_pretty_differ_as_promised() {
    let port = free_port().to_string();
    let failing_start = |format: Option<&str>| {
        let mut args = vec![
            "--worker-id",
            "not-a-uuid",
            "--model",
            "/no/such/m.gguf",
            "--gpu-device",
            "0",
        ];
        args.extend(["--port", port.as_str()]);
        if let Some(f) = format {
            args.extend(["--log-format", f]);
        }
        let (status, stderr) = run_to_exit(&args);
        assert_eq!(status.code(), Some(1), "{format:?}: {stderr}");
        stderr
    };
    for format in [None, Some("json"), Some("auto")] {
        let stderr = failing_start(format);
        let errors = error_records(&stderr);
        assert_eq!(
            errors.len(),
            1,
            "{format:?}: one JSON ERROR record: {stderr}"
        );
        assert_eq!(errors[0]["flag"], "--worker-id");
    }
    let pretty = failing_start(Some("pretty"));
    let line = pretty
        .lines()
        .find(|l| l.contains("ERROR"))
        .unwrap_or_else(|| panic!("no ERROR line: {pretty}"));
    assert!(
        serde_json::from_str::<Value>(line).is_err(),
        "pretty is not JSON: {line}"
    );
    assert!(error_records(&pretty).is_empty(), "{pretty}");
    // The terminal's one-line format (telemetry/text.rs): the level, the
    // event, then the fields that vary, unquoted.
    for fact in [
        " ERROR error ",
        "code=INVALID_CONFIG",
        "flag=--worker-id",
        "not-a-uuid",
    ] {
        assert!(line.contains(fact), "{fact} in {line}");
    }
    let (status, stderr) = run_to_exit(&["--log-format", "fancy"]);
    assert_eq!(
        status.code(),
        Some(2),
        "an unknown format is a usage error: {stderr}"
    );
}
