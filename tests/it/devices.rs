//! Several devices in one process (`--device cpu:0,cpu:1`, `[scheduler]
//! devices`): one Salus core each, trials placed on both, the progress
//! output per device, and bad device lists refused.

use crate::common::*;

#[test]
fn built_in_trials_run_on_two_cpu_devices_of_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let study = StudyFile::digits("two", 6).build();
    write(dir.path(), "s.toml", &study);
    let out = run_in(
        dir.path(),
        &["s.toml", "--no-progress", "--device", "cpu:0,cpu:1"],
    );
    let log = text(&out);
    assert_eq!(out.status.code(), Some(0), "{log}");
    let db = dir.path().join("two.db");
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'"),
        6
    );
    for d in ["cpu:0", "cpu:1"] {
        assert!(
            scalar(
                &db,
                &format!("SELECT COUNT(*) FROM salus_trials WHERE device = '{d}'")
            ) > 0,
            "{d} ran trials"
        );
        // The progress output: where trials run, and each device's share.
        assert!(log.contains(&format!("runs on {d}")), "{log}");
        assert!(log.contains(&format!("{d}: ")), "{log}");
    }
    assert!(log.contains("one Salus core each"), "{log}");
    // The run records both devices and all their lanes.
    let device = scalar_text(&db, "SELECT device FROM salus_runs").unwrap();
    assert!(
        device.starts_with("cpu:0 ") && device.contains(", cpu:1 "),
        "{device}"
    );
    let lanes = scalar(&db, "SELECT lanes FROM salus_runs");
    let segments = scalar(&db, "SELECT COUNT(DISTINCT lane) FROM salus_lane_segments");
    assert!(
        lanes >= 2 && segments >= 2,
        "lanes {lanes}, used {segments}"
    );
}

#[test]
fn idle_devices_take_turns_when_trials_run_one_at_a_time() {
    // Trials this short often end before the next is claimed; each then
    // finds both devices idle, and they must not all land on the first.
    let dir = tempfile::tempdir().unwrap();
    let study = StudyFile::digits("turns", 6)
        .set("scheduler", "max_concurrent", "1")
        .build();
    write(dir.path(), "s.toml", &study);
    let out = run_in(
        dir.path(),
        &["s.toml", "--no-progress", "--device", "cpu:0,cpu:1"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("turns.db");
    for d in ["cpu:0", "cpu:1"] {
        assert_eq!(
            scalar(
                &db,
                &format!("SELECT COUNT(*) FROM salus_trials WHERE device = '{d}'")
            ),
            3,
            "{d}"
        );
    }
}

#[test]
fn the_study_file_names_the_devices_and_the_command_line_wins() {
    let dir = tempfile::tempdir().unwrap();
    let study = StudyFile::digits("file", 2)
        .set("scheduler", "devices", "[\"cpu:0\", \"cpu:1\"]")
        .build();
    write(dir.path(), "f.toml", &study);
    let out = run_in(dir.path(), &["f.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("devices: cpu:0"), "{}", text(&out));
    // `--device cpu` takes the whole CPU as one device instead.
    let out = run_in(
        dir.path(),
        &["f.toml", "--no-progress", "--more", "1", "--device", "cpu"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!text(&out).contains("devices: cpu:0"), "{}", text(&out));
}

#[test]
fn a_bad_device_list_is_refused_with_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let study = StudyFile::digits("bad", 2)
        .set("scheduler", "devices", "[\"cpu:0\", \"cuda:1\"]")
        .build();
    let path = write(dir.path(), "b.toml", &study);
    let out = run_in(dir.path(), &["check", "b.toml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let msg = text(&out);
    assert!(
        msg.contains(&path.display().to_string()) || msg.contains("b.toml"),
        "{msg}"
    );
    assert!(
        msg.contains("scheduler.devices") && msg.contains("one kind"),
        "{msg}"
    );
    let out = run_in(dir.path(), &["b.toml", "--device", "cuda:0,cuda:0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("named twice"), "{}", text(&out));
}
