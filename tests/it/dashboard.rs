//! The dashboard: widgets rendered on ratatui's TestBackend (insta
//! snapshots at 80x24 and 120x40, detail, help), keys as pure state
//! changes, a snapshot read from a real study's database, and the real
//! binary driven in tmux against a running study.

use std::time::Duration;

use crate::common::*;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use salus_tune::dash::snapshot::{Event, LaneInfo, Phase, SPARK_SECONDS, Snapshot, TrialInfo};
use salus_tune::dash::state::{self, Action, Key, SortKey, ViewState};
use salus_tune::dash::view;
use salus_tune::storage::dashboard::DashCommand;
use salus_tune::storage::{TrialId, TrialNumber, TrialState};
use salus_tune::study::Direction;

fn trial(number: i64, phase: Phase, value: Option<f64>, curve: &[f64]) -> TrialInfo {
    TrialInfo {
        trial_id: TrialId(number + 1),
        number: TrialNumber(number),
        phase,
        params: vec![
            ("lr".into(), format!("{}", 0.001 * (number + 1) as f64)),
            (
                "optimizer".into(),
                if number % 2 == 0 { "adam" } else { "sgd" }.into(),
            ),
            ("width".into(), format!("{}", 32 << (number % 3))),
            if number % 2 == 0 {
                ("adam.beta2".into(), "0.9990000000000001".into())
            } else {
                (
                    "sgd.momentum".into(),
                    format!("{}", 0.5 + 0.0625 * number as f64),
                )
            },
        ],
        value,
        more_values: vec![],
        feasible: true,
        curve: curve
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as i64 + 1, v))
            .collect(),
        rung: (phase == Phase::Paused).then_some(1),
        priority: (phase == Phase::Paused).then_some(0.25),
        lane: phase.is_live().then_some(number % 2),
        device: None,
        iterations: 10 * curve.len() as i64,
        total_iterations: 40,
        its_per_s: phase.is_live().then_some(850.0 + number as f64),
        persistent_bytes: 3 << 20,
        ephemeral_bytes: 1 << 20,
        shared_bytes: 512 << 10,
        fused_with: if number == 4 || number == 6 {
            vec![TrialNumber(4), TrialNumber(6)]
        } else {
            vec![]
        },
        fail_reason: (phase == Phase::Failed).then(|| "diverged at iteration 12".into()),
        user_attrs: if number == 2 {
            vec![
                ("arch".into(), r#"{"layers":[64,32]}"#.into()),
                ("train_loss".into(), "0.125".into()),
            ]
        } else {
            vec![]
        },
        events: vec![
            Event {
                time: "2026-11-29 10:00:01.000000".into(),
                kind: "trial_start".into(),
                detail: "{}".into(),
            },
            Event {
                time: "2026-11-29 10:00:04.500000".into(),
                kind: "trial_complete".into(),
                detail: "{\"state\":\"COMPLETE\"}".into(),
            },
        ],
    }
}

fn fixture() -> Snapshot {
    Snapshot {
        study: "demo".into(),
        direction: Direction::Maximize,
        metric: "val_accuracy".into(),
        device: "cpu (2 threads)".into(),
        policy: "priority".into(),
        budget_bytes: 64 << 20,
        budget_trials: Some(12),
        running: true,
        elapsed_s: 95.0,
        trials: vec![
            trial(0, Phase::Complete, Some(0.91), &[0.6, 0.8, 0.88, 0.91]),
            trial(1, Phase::Pruned, None, &[0.3, 0.35]),
            trial(2, Phase::Complete, Some(0.95), &[0.7, 0.9, 0.93, 0.95]),
            trial(3, Phase::Failed, None, &[0.2]),
            trial(4, Phase::Running, None, &[0.5, 0.7, 0.8]),
            trial(5, Phase::Paused, None, &[0.4, 0.5]),
            trial(6, Phase::Swapped, None, &[0.45]),
            trial(7, Phase::Waiting, None, &[]),
        ],
        lanes: (0..2)
            .map(|l| LaneInfo {
                lane: l,
                busy: (0..SPARK_SECONDS as u64)
                    .map(|i| (i * 7 + l as u64 * 30) % 101)
                    .collect(),
                iterations: 1000 + l,
                switches: 40 + l,
            })
            .collect(),
        swaps: 3,
        objectives: vec![("val_accuracy".into(), Direction::Maximize)],
    }
}

fn render(w: u16, h: u16, snap: &Snapshot, v: &ViewState) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| view::draw(f, snap, v)).unwrap();
    format!("{}", t.backend())
}

#[test]
fn the_dashboard_at_80x24() {
    let screen = render(80, 24, &fixture(), &ViewState::default());
    let lines: Vec<&str> = screen.lines().collect();
    // Header and footer end inside the 80 columns: what does not fit is
    // left out whole (the device, later keys), never cut mid-word.
    assert!(lines[0].ends_with("ETA 3m10s       \""), "{}", lines[0]);
    assert!(lines[1].ends_with("1 fail \""), "{}", lines[1]);
    assert!(
        lines[23].contains("?: help") && lines[23].contains("p/r/x: pause/resume/prune"),
        "{}",
        lines[23]
    );
    // Searched parameters keep their full names, as many as fit.
    assert!(
        screen.contains("lr=0.001 optimizer=adam width=32 adam.beta2=0.999"),
        "{screen}"
    );
    insta::assert_snapshot!(screen);
}

/// The fixture as a study of accuracy against size: the complete trials
/// 0 (0.91, 300), 2 (0.95, 900) and a third, 8 (0.80, 500), which both
/// beat.
fn two_objectives() -> Snapshot {
    let mut snap = fixture();
    snap.objectives.push(("params".into(), Direction::Minimize));
    for t in &mut snap.trials {
        t.more_values = match t.number.0 {
            0 => vec![300.0],
            2 => vec![900.0],
            _ => vec![],
        };
    }
    let mut dominated = trial(8, Phase::Complete, Some(0.80), &[0.7, 0.8]);
    dominated.more_values = vec![500.0];
    snap.trials.push(dominated);
    snap
}

#[test]
fn a_study_of_several_objectives_draws_its_front_and_walks_along_it() {
    let snap = two_objectives();
    assert_eq!(snap.front(), vec![TrialNumber(0), TrialNumber(2)]);
    let screen = render(120, 40, &snap, &ViewState::default());
    assert!(
        screen.contains("Pareto front (2 trials): val_accuracy × params"),
        "{screen}"
    );
    assert!(!screen.contains("Optimization history"), "{screen}");
    // `]` and `[` walk the front in the first objective's order.
    let mut v = ViewState::default();
    let step = |v: &mut ViewState, k| {
        let a = state::action(v, k);
        v.apply(&snap, a);
        v.selected
    };
    assert_eq!(step(&mut v, Key::Char(']')), Some(TrialNumber(0)));
    assert_eq!(step(&mut v, Key::Char(']')), Some(TrialNumber(2)));
    assert_eq!(step(&mut v, Key::Char(']')), Some(TrialNumber(2)));
    assert_eq!(step(&mut v, Key::Char('[')), Some(TrialNumber(0)));
    // A third objective: `o` plots it against the first instead.
    let mut three = two_objectives();
    three.objectives.push(("flops".into(), Direction::Minimize));
    for t in &mut three.trials {
        if !t.more_values.is_empty() {
            t.more_values.push(1e6);
        }
    }
    let mut v = ViewState::default();
    assert!(render(120, 40, &three, &v).contains("val_accuracy × params"));
    let a = state::action(&v, Key::Char('o'));
    v.apply(&three, a);
    assert!(render(120, 40, &three, &v).contains("val_accuracy × flops"));
    // One objective: no front, the history as before.
    assert!(fixture().front().is_empty());
}

#[test]
fn a_run_on_two_devices_shows_each() {
    let mut snap = fixture();
    for t in &mut snap.trials {
        t.device = t.lane.map(|l| format!("cuda:{l}"));
    }
    let screen = render(120, 40, &snap, &ViewState::default());
    // Trials 4 and 6 are live on lane 0 of cuda:0, trial 5 on cuda:1.
    assert!(screen.contains("cuda:0: 2 live · #pers 6.0MiB"), "{screen}");
    assert!(screen.contains("cuda:1: 1 live · #pers 3.0MiB"), "{screen}");
    assert!(
        screen.contains("cuda:0 L0") && screen.contains("cuda:1 L1"),
        "{screen}"
    );
    // On one device, no per-device lines.
    let screen = render(120, 40, &fixture(), &ViewState::default());
    assert!(!screen.contains("live ·"), "{screen}");
}

#[test]
fn the_dashboard_at_120x40_uses_the_room() {
    let screen = render(120, 40, &fixture(), &ViewState::default());
    // Wide tables gain the priority, lane and speed columns.
    assert!(
        screen.contains("prio") && screen.contains("it/s"),
        "{screen}"
    );
    insta::assert_snapshot!(screen);
}

/// The view after selecting the third trial (#2) and opening its detail.
fn third_trial_s_detail(snap: &Snapshot) -> ViewState {
    let mut v = ViewState::default();
    for k in [Key::Down, Key::Down, Key::Enter] {
        let a = state::action(&v, k);
        v.apply(snap, a);
    }
    v
}

#[test]
fn the_detail_pane_and_the_help() {
    let snap = fixture();
    let mut v = third_trial_s_detail(&snap);
    let detail = render(100, 30, &snap, &v);
    assert!(
        detail.contains("Trial #2")
            && detail.contains("footprint")
            && detail.contains("adam.beta2=0.9990000000000001")
            && detail.contains(r#"attrs: arch={"layers":[64,32]}"#),
        "{detail}"
    );
    insta::assert_snapshot!("detail", detail);
    let a = state::action(&v, Key::Char('?'));
    v.apply(&snap, a);
    insta::assert_snapshot!("help", render(80, 24, &snap, &v));
}

/// A PBT member's detail: its schedule step by step on the left, and the
/// knob that moved as a line over its steps above its events.
#[test]
fn a_pbt_member_s_detail_draws_its_schedule() {
    let mut snap = fixture();
    snap.trials[2].user_attrs.push((
        "pbt:schedule".into(),
        r#"[{"step":0,"params":{"lr":0.1}},{"step":2,"from":0,"params":{"lr":0.0125}}]"#.into(),
    ));
    let v = third_trial_s_detail(&snap);
    let detail = render(120, 44, &snap, &v);
    assert!(
        detail.contains("step 2 from #0: lr=0.0125") && detail.contains("Schedule: log10 lr"),
        "{detail}"
    );
    insta::assert_snapshot!("pbt_detail", detail);
}

#[test]
fn header_counts_best_and_memory() {
    let snap = fixture();
    assert_eq!(snap.best(), Some((TrialNumber(2), 0.95)));
    assert_eq!(snap.finished(), 4);
    assert_eq!(snap.count(Phase::Running), 1);
    // Resident: running and paused (the swapped trial's state is on the host).
    assert_eq!(snap.memory(), (6 << 20, 2 << 20));
    assert_eq!(snap.fused_groups(), vec![2], "one live group of two");
    assert_eq!(view::memory_bar(10, 100, 30, 20), "###==.....");
    assert_eq!(view::duration(3725.0), "1h02m");
    assert_eq!(view::bytes(3 << 20), "3.0MiB");
}

#[test]
fn keys_sort_filter_search_and_select() {
    let snap = fixture();
    let mut v = ViewState::default();
    let press = |v: &mut ViewState, k: Key| {
        let a = state::action(v, k);
        v.apply(&snap, a)
    };
    let numbers = |v: &ViewState| v.rows(&snap).iter().map(|t| t.number.0).collect::<Vec<_>>();
    assert_eq!(numbers(&v), (0..8).collect::<Vec<_>>());
    press(&mut v, Key::Char('s')); // state
    press(&mut v, Key::Char('s')); // metric
    assert_eq!(v.sort, SortKey::Metric);
    press(&mut v, Key::Char('S'));
    assert_eq!(numbers(&v)[..2], [2, 0], "best metric first, descending");
    press(&mut v, Key::Char('f')); // live
    assert_eq!(numbers(&v), vec![4, 5, 6, 7]);
    for k in [
        Key::Char('/'),
        Key::Char('s'),
        Key::Char('g'),
        Key::Char('d'),
    ] {
        press(&mut v, k);
    }
    assert!(v.searching);
    press(&mut v, Key::Enter);
    assert_eq!(
        numbers(&v),
        vec![5, 7],
        "live trials whose optimizer is sgd"
    );
    press(&mut v, Key::Char('j'));
    assert_eq!(v.current(&snap).unwrap().number, TrialNumber(7));
    press(&mut v, Key::Char('k'));
    assert_eq!(v.current(&snap).unwrap().number, TrialNumber(5));
    press(&mut v, Key::Esc);
    assert_eq!(state::action(&v, Key::Char('q')), Action::Quit);
    assert_eq!(state::action(&v, Key::Ctrl('c')), Action::Quit);
}

#[test]
fn commands_go_only_to_live_trials_of_a_running_study() {
    let mut snap = fixture();
    let mut v = ViewState::default();
    // Trial 0 is complete: nothing is sent.
    assert_eq!(v.apply(&snap, Action::Command(DashCommand::Prune)), None);
    assert!(v.message.contains("cannot be pruned"), "{}", v.message);
    v.selected = Some(TrialNumber(5));
    assert_eq!(
        v.apply(&snap, Action::Command(DashCommand::Resume)),
        Some((TrialId(6), DashCommand::Resume))
    );
    assert!(v.message.contains("next iteration boundary"));
    snap.running = false;
    assert_eq!(v.apply(&snap, Action::Command(DashCommand::Pause)), None);
    assert!(v.message.contains("not running"));
}

/// A study long enough to act on while it runs.
fn slow_study(name: &str) -> String {
    StudyFile::new(name, 6, 2)
        .set("model", "depth", "2")
        .set("model", "width", "256")
        .set("train", "optimizer", "\"adam\"")
        .set("train", "lr", "{ float = [1e-3, 1e-2], log = true }")
        .set("train", "batch_size", "32")
        .set("train", "epochs", "400")
        .set("scheduler", "max_concurrent", "2")
        .set("scheduler", "fuse", "1")
        .build()
}

#[test]
fn a_snapshot_reads_a_real_study() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &small_study("real", 4));
    let out = run_in(dir.path(), &["s.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let url = dir.path().join("real.db").display().to_string();
    let snap = block_on(salus_tune::dash::read(&url, None)).unwrap();
    assert_eq!(snap.study, "real");
    assert_eq!(snap.metric, "val_accuracy");
    assert!(!snap.running, "the run stopped");
    assert_eq!(snap.budget_trials, Some(4));
    assert_eq!(snap.count(Phase::Complete), 4);
    assert!(snap.best().is_some());
    for t in &snap.trials {
        assert_eq!(t.curve.len(), 3, "one value per epoch");
        assert!(
            t.params
                .iter()
                .any(|(n, v)| n == "optimizer" && (v == "sgd" || v == "adam")),
            "{:?}",
            t.params
        );
        assert!(t.its_per_s.is_some_and(|s| s > 0.0));
        assert!(t.persistent_bytes > 0);
        assert!(t.events.iter().any(|e| e.kind == "trial_start"));
    }
    assert!(!snap.lanes.is_empty());
}

/// The real binary in tmux: it shows a running study, prunes the selected
/// trial through the database, and restores the terminal on `q`.
#[test]
fn the_binary_in_tmux_prunes_pauses_and_resumes_running_trials() {
    if std::process::Command::new("tmux")
        .arg("-V")
        .output()
        .is_err()
    {
        if std::env::var_os("SALUS_TUNE_REQUIRE_TMUX").is_some() {
            panic!("tmux is required (SALUS_TUNE_REQUIRE_TMUX) but not installed");
        }
        eprintln!(
            "the_binary_in_tmux_prunes_pauses_and_resumes_running_trials: skipped: tmux is not installed"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "slow.toml", &slow_study("slow"));
    let db = dir.path().join("slow.db");
    let study = Running::spawn(
        bin()
            .current_dir(dir.path())
            .args(["slow.toml", "--no-progress"]),
    );
    wait_until("two running trials", Duration::from_secs(30), || {
        migrated(&db)
            && trials(&db, None)
                .iter()
                .filter(|t| t.state == TrialState::Running)
                .count()
                == 2
    });
    let socket = dir.path().join("tmux.sock");
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux")
            .arg("-S")
            .arg(&socket)
            .args(args)
            .output()
            .unwrap()
    };
    // The shell stays (sleep) so that the pane can be read after the exit.
    let cmd = format!(
        "{} dash slow.toml; echo DASH-EXITED-$?; sleep 60",
        env!("CARGO_BIN_EXE_salus-tune")
    );
    let started = tmux(&[
        "new-session",
        "-d",
        "-x",
        "100",
        "-y",
        "30",
        "-c",
        dir.path().to_str().unwrap(),
        &cmd,
    ]);
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    let screen = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p"]).stdout).to_string();
    wait_until("the dashboard", Duration::from_secs(15), || {
        screen().contains("slow · maximize")
    });
    let s = screen();
    assert!(
        s.contains("RUNNING") && s.contains("Device") && s.contains("Optimization history"),
        "{s}"
    );
    // Trial 0 runs and is selected first: prune it.
    tmux(&["send-keys", "x"]);
    wait_until("trial 0 pruned", Duration::from_secs(20), || {
        trials(&db, None)
            .iter()
            .any(|t| t.number.0 == 0 && t.state == TrialState::Pruned)
    });
    wait_until("the dashboard to show it", Duration::from_secs(10), || {
        screen().contains("PRUNED")
    });
    // Trial 1 is next in the list: pause it, then resume it.
    let reason = |n: i64| {
        scalar_text(
            &db,
            &format!(
                "SELECT p.reason FROM salus_priority p JOIN trials t ON t.trial_id = p.trial_id \
                 WHERE t.number = {n} ORDER BY p.priority_id DESC LIMIT 1"
            ),
        )
    };
    tmux(&["send-keys", "j"]);
    tmux(&["send-keys", "p"]);
    wait_until("trial 1 paused", Duration::from_secs(20), || {
        reason(1).as_deref() == Some("paused")
    });
    wait_until("the dashboard to show it", Duration::from_secs(10), || {
        screen().contains("PAUSED")
    });
    tmux(&["send-keys", "r"]);
    wait_until("trial 1 resumed", Duration::from_secs(20), || {
        reason(1).as_deref() == Some("resumed")
    });
    tmux(&["send-keys", "q"]);
    wait_until("the dashboard to exit", Duration::from_secs(10), || {
        screen().contains("DASH-EXITED-0")
    });
    tmux(&["kill-server"]);
    study.kill();
    let pruned = trials(&db, None);
    let t0 = pruned.iter().find(|t| t.number.0 == 0).unwrap();
    assert_eq!(t0.state, TrialState::Pruned);
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_commands WHERE applied IS NOT NULL"
        ),
        3,
        "prune, pause and resume were taken"
    );
}
