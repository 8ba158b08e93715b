//! The statements behind each of the writer's ops, run inside its
//! transaction once the op's claim is known to hold (see `writer`).

use sqlx::{AnyConnection, Row};

use super::claims::Claim;
use super::dialect::{Clock, Dialect, sql};
use super::read::HELD_BELOW_CUT;
use super::writer::{Answer, NewTrial, TakenCommand, TrialEnd, WriteOp};
use super::{StoredParam, TrialId, TrialNumber, TrialState};
use crate::dashboard::DashCommand;
use crate::ids::{RunId, StudyId};

pub(super) async fn trial_progress(
    conn: &mut AnyConnection,
    op: &WriteOp,
    time: &str,
) -> std::result::Result<(), sqlx::Error> {
    match op {
        WriteOp::Resources {
            claim,
            resources: r,
        } => {
            sqlx::query(&sql(&*conn, "INSERT INTO salus_trials (trial_id, device, lane, persistent_bytes, ephemeral_bytes, shared_bytes, total_iterations) VALUES (?, ?, ?, ?, ?, ?, ?) \
                 ON CONFLICT (trial_id) DO UPDATE SET device = excluded.device, lane = excluded.lane, persistent_bytes = excluded.persistent_bytes, \
                 ephemeral_bytes = excluded.ephemeral_bytes, shared_bytes = excluded.shared_bytes, total_iterations = excluded.total_iterations, \
                 iterations = 0, device_seconds = 0, fail_reason = NULL",))
            .bind(claim.trial_id)
            .bind(&r.device)
            .bind(r.lane)
            .bind(r.persistent_bytes)
            .bind(r.ephemeral_bytes)
            .bind(r.shared_bytes)
            .bind(r.total_iterations)
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::Intermediate { claim, step, value } => {
            let (v, kind) = optuna_value(*value, true);
            sqlx::query(&sql(&*conn, "INSERT INTO trial_intermediate_values (trial_id, step, intermediate_value, intermediate_value_type) VALUES (?, ?, NULLIF(?::float8, 'NaN'), ?::trialintermediatevaluetype) \
                 ON CONFLICT (trial_id, step) DO UPDATE SET intermediate_value = excluded.intermediate_value, intermediate_value_type = excluded.intermediate_value_type",))
            .bind(claim.trial_id)
            .bind(*step)
            .bind(nan_for_null(v))
            .bind(kind)
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::Priority {
            claim,
            priority,
            rung,
            reason,
        } => {
            sqlx::query(&sql(&*conn, "INSERT INTO salus_priority (trial_id, time, priority, rung, reason) VALUES (?, ?::timestamp, ?, ?, ?)"))
                .bind(claim.trial_id)
                .bind(time)
                .bind(*priority)
                .bind(*rung)
                .bind(*reason)
                .execute(&mut *conn)
                .await?;
        }
        WriteOp::TrialAttr {
            claim,
            key,
            value_json,
        } => {
            set_trial_attr(conn, Attrs::System, claim.trial_id, key, value_json).await?;
        }
        _ => unreachable!("write_op routes only trial progress here"),
    }
    Ok(())
}

/// Auxiliary metrics (a curve row each, and the latest value as the user
/// attribute of that name) and user attributes, each replacing an earlier
/// one of its key.
pub(super) async fn trial_extras(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    step: i64,
    extras: &training::ReportExtras,
) -> std::result::Result<(), sqlx::Error> {
    for (name, v) in &extras.metrics {
        sqlx::query(&sql(
            &*conn,
            "INSERT INTO salus_metrics (trial_id, name, step, value) VALUES (?, ?, ?, NULLIF(?::float8, 'NaN')) \
             ON CONFLICT (trial_id, name, step) DO UPDATE SET value = excluded.value",
        ))
        .bind(trial_id)
        .bind(name)
        .bind(step)
        .bind(nan_for_null(v.is_finite().then_some(*v)))
        .execute(&mut *conn)
        .await?;
        let latest = serde_json::Number::from_f64(*v).map_or(serde_json::Value::Null, Into::into);
        set_trial_attr(conn, Attrs::User, trial_id, name, &latest.to_string()).await?;
    }
    for (key, value_json) in &extras.attrs {
        set_trial_attr(conn, Attrs::User, trial_id, key, value_json).await?;
    }
    Ok(())
}

/// Optuna's two tables of trial attributes.
#[derive(Clone, Copy)]
pub(super) enum Attrs {
    User,
    System,
}

/// Sets a trial attribute (a JSON value), replacing an earlier one.
pub(super) async fn set_trial_attr(
    conn: &mut AnyConnection,
    table: Attrs,
    trial_id: TrialId,
    key: &str,
    value_json: &str,
) -> std::result::Result<(), sqlx::Error> {
    let table = match table {
        Attrs::User => "trial_user_attributes",
        Attrs::System => "trial_system_attributes",
    };
    sqlx::query(&sql(
        &*conn,
        &format!(
            "INSERT INTO {table} (trial_id, \"key\", value_json) VALUES (?, ?, ?) \
         ON CONFLICT (trial_id, \"key\") DO UPDATE SET value_json = excluded.value_json"
        ),
    ))
    .bind(trial_id)
    .bind(key)
    .bind(value_json)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// See [`WriteOp::KeepModel`].
pub(super) async fn keep_model(
    conn: &mut AnyConnection,
    op: &WriteOp,
    time: &str,
) -> std::result::Result<(), sqlx::Error> {
    let WriteOp::KeepModel {
        claim,
        architecture,
        weights,
        best_of,
    } = op
    else {
        unreachable!("only KeepModel comes here")
    };
    let trial_id = &claim.trial_id;
    if let Some(maximize) = best_of {
        // Two processes finishing close together must not each see the
        // other's model as not yet kept and delete it: the study is held.
        let study_id: StudyId = sqlx::query_scalar(&sql(
            &*conn,
            "SELECT study_id FROM trials WHERE trial_id = ?",
        ))
        .bind(*trial_id)
        .fetch_one(&mut *conn)
        .await?;
        lock_study(conn, study_id).await?;
        let as_good = if *maximize { ">=" } else { "<=" };
        let rivals: i64 = sqlx::query_scalar(&sql(&*conn, &format!(
            "SELECT COUNT(*) FROM trials me \
             JOIN trial_values mv ON mv.trial_id = me.trial_id AND mv.objective = 0 \
             JOIN trials t ON t.study_id = me.study_id AND t.trial_id <> me.trial_id AND t.state = 'COMPLETE' \
             JOIN trial_values v ON v.trial_id = t.trial_id AND v.objective = 0 \
             WHERE me.trial_id = ? AND v.value {as_good} mv.value"
        )))
        .bind(*trial_id)
        .fetch_one(&mut *conn)
        .await?;
        if rivals > 0 {
            return Ok(());
        }
        sqlx::query(&sql(&*conn, "DELETE FROM salus_models WHERE trial_id IN \
             (SELECT trial_id FROM trials WHERE study_id = (SELECT study_id FROM trials WHERE trial_id = ?))",))
        .bind(*trial_id)
        .execute(&mut *conn)
        .await?;
    }
    sqlx::query(&sql(&*conn, "INSERT INTO salus_models (trial_id, created, architecture, weights) VALUES (?, ?::timestamp, ?, ?) \
         ON CONFLICT (trial_id) DO UPDATE SET created = excluded.created, \
         architecture = excluded.architecture, weights = excluded.weights",))
    .bind(*trial_id)
    .bind(time)
    .bind(architecture)
    .bind(weights.as_slice())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The core's runs, lane segments, swaps and lane totals.
pub(super) async fn run_telemetry(
    conn: &mut AnyConnection,
    op: &WriteOp,
    clock: &Clock,
) -> std::result::Result<Option<Answer>, sqlx::Error> {
    match op {
        WriteOp::StartRun { study_id, run, .. } => {
            lock_study(conn, *study_id).await?;
            let index = super::claims::free_process_index(conn, *study_id, run.liveness_s).await?;
            let run_id: RunId = sqlx::query_scalar(&sql(&*conn, "INSERT INTO salus_runs (study_id, started_at, device, policy, lanes, threads_per_lane, budget_bytes, \
                 host, pid, process_index, heartbeat, pid_namespace) VALUES (?, ?::timestamp, ?, ?, ?, ?, ?, ?, ?, ?, ?::timestamp, ?) RETURNING run_id",))
            .bind(*study_id)
            .bind(&clock.local)
            .bind(&run.device)
            .bind(&run.policy)
            .bind(run.lanes)
            .bind(run.threads_per_lane)
            .bind(run.budget_bytes)
            .bind(&run.host)
            .bind(run.pid)
            .bind(index)
            .bind(&clock.beat)
            .bind(run.pid_namespace.as_deref())
            .fetch_one(&mut *conn)
            .await?;
            return Ok(Some(Answer::RunId((run_id, index))));
        }
        WriteOp::Segment {
            run_id,
            lane,
            trial_id,
            start_s,
            end_s,
            iterations,
        } => {
            sqlx::query(&sql(&*conn, "INSERT INTO salus_lane_segments (run_id, lane, trial_id, start_s, end_s, iterations) VALUES (?, ?, ?, ?, ?, ?)"))
                .bind(*run_id)
                .bind(*lane)
                .bind(*trial_id)
                .bind(*start_s)
                .bind(*end_s)
                .bind(*iterations)
                .execute(&mut *conn)
                .await?;
        }
        WriteOp::Swap {
            run_id,
            trial_id,
            lane,
            out,
            bytes,
            seconds,
            time_s,
            medium,
        } => {
            sqlx::query(&sql(&*conn, "INSERT INTO salus_swaps (run_id, trial_id, lane, direction, bytes, seconds, time_s, medium) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"))
                .bind(*run_id)
                .bind(*trial_id)
                .bind(*lane)
                .bind(if *out { "out" } else { "in" })
                .bind(*bytes)
                .bind(*seconds)
                .bind(*time_s)
                .bind(*medium)
                .execute(&mut *conn)
                .await?;
        }
        WriteOp::LaneStats { run_id, stats: s } => {
            sqlx::query(&sql(&*conn, "INSERT INTO salus_lane_stats (run_id, lane, iterations, busy_s, wall_s, switches, switch_mean_us, switch_max_us) VALUES (?, ?, ?, ?, ?, ?, NULLIF(?::float8, 'NaN'), NULLIF(?::float8, 'NaN')) \
                 ON CONFLICT (run_id, lane) DO UPDATE SET iterations = excluded.iterations, busy_s = excluded.busy_s, wall_s = excluded.wall_s, \
                 switches = excluded.switches, switch_mean_us = excluded.switch_mean_us, switch_max_us = excluded.switch_max_us",))
            .bind(*run_id)
            .bind(s.lane)
            .bind(s.iterations)
            .bind(s.busy_s)
            .bind(s.wall_s)
            .bind(s.switches)
            .bind(nan_for_null(s.switch_mean_us))
            .bind(nan_for_null(s.switch_max_us))
            .execute(&mut *conn)
            .await?;
        }
        _ => unreachable!("write_op routes only telemetry here"),
    }
    Ok(None)
}

/// Optuna's encoding of a float: `(value, type)`, with non-finite values
/// stored as NULL (intermediate NaN) or by their type alone.
/// A nullable float as a statement binds it: NaN for NULL, turned back into
/// NULL by `NULLIF(?::float8, 'NaN')`. sqlx 0.8's `Any` driver sends a
/// `None::<f64>` to PostgreSQL as a `float4` NULL, which a statement prepared
/// with a `float8` in that place refuses ("incorrect binary data format");
/// SQLite stores a bound NaN as NULL itself.
fn nan_for_null(v: Option<f64>) -> f64 {
    v.unwrap_or(f64::NAN)
}

fn optuna_value(v: f64, intermediate: bool) -> (Option<f64>, &'static str) {
    if v.is_nan() {
        (None, if intermediate { "NAN" } else { "FINITE" })
    } else if v == f64::INFINITY {
        (None, "INF_POS")
    } else if v == f64::NEG_INFINITY {
        (None, "INF_NEG")
    } else {
        (Some(v), "FINITE")
    }
}

/// Records an event in `salus_events`.
pub(super) async fn event(
    conn: &mut AnyConnection,
    study_id: StudyId,
    trial_id: Option<TrialId>,
    kind: &str,
    detail: &str,
    time: &str,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(&sql(conn, "INSERT INTO salus_events (study_id, trial_id, time, kind, detail) VALUES (?, ?, ?::timestamp, ?, ?)",))
    .bind(study_id)
    .bind(trial_id)
    .bind(time)
    .bind(kind)
    .bind(detail)
    .execute(conn)
    .await?;
    Ok(())
}

/// An event for a trial, its study looked up.
pub(super) async fn study_event(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    kind: &str,
    detail: &str,
    time: &str,
) -> std::result::Result<(), sqlx::Error> {
    let study_id: StudyId = sqlx::query_scalar(&sql(
        &*conn,
        "SELECT study_id FROM trials WHERE trial_id = ?",
    ))
    .bind(trial_id)
    .fetch_one(&mut *conn)
    .await?;
    event(conn, study_id, Some(trial_id), kind, detail, time).await
}

/// A new RUNNING trial, numbered after the study's others (the write lock
/// of `BEGIN IMMEDIATE` makes the count and the insert one step), with its
/// parameters and its claim; none when the study has its budget of trials,
/// or when its trials in flight fill the cap (counted under the same lock).
/// Its start is the time after that count.
pub(super) async fn create_trial(
    conn: &mut AnyConnection,
    op: &WriteOp,
    clock: &Clock,
) -> std::result::Result<Option<Answer>, sqlx::Error> {
    let WriteOp::CreateTrial {
        study_id,
        params,
        fixed,
        run_id,
        budget,
        cap,
        ..
    } = op
    else {
        unreachable!("only CreateTrial comes here")
    };
    let number = next_number(conn, *study_id).await?;
    if number.0 as u64 >= *budget {
        return Ok(Some(Answer::Ids(NewTrial::BudgetMet)));
    }
    let trials = number.0 as u64;
    if let Some(cap) = cap
        && let Some(limit) = (cap.cap_at.0)(trials)
    {
        let elsewhere = in_flight_elsewhere(conn, *study_id, *run_id).await?;
        if cap.here + elsewhere >= limit {
            return Ok(Some(Answer::Ids(NewTrial::AtCap { trials, elsewhere })));
        }
    }
    // Stamped after the lock and the count, not when the transaction
    // began: on PostgreSQL the wait for the study's row comes after
    // `BEGIN`, and the stored starts should order as the checks did, so
    // that what was alive at a start can be read back from the times.
    let clock = &Clock {
        local: super::now(),
        beat: clock.beat.clone(),
    };
    let time = clock.local.as_str();
    let trial_id: TrialId = sqlx::query_scalar(&sql(&*conn, "INSERT INTO trials (number, study_id, state, datetime_start) VALUES (?, ?, 'RUNNING', ?::timestamp) RETURNING trial_id"))
            .bind(number.0)
            .bind(*study_id)
            .bind(time)
            .fetch_one(&mut *conn)
            .await?;
    insert_params(conn, trial_id, params).await?;
    set_trial_attr(conn, Attrs::User, trial_id, super::record::FIXED_KEY, fixed).await?;
    let claim = super::claims::claim(conn, trial_id, *run_id, clock).await?;
    event(
        &mut *conn,
        *study_id,
        Some(trial_id),
        "trial_start",
        &serde_json::json!({ "number": number, "run_id": run_id, "attempt": claim.attempt })
            .to_string(),
        time,
    )
    .await?;
    Ok(Some(Answer::Ids(NewTrial::Created(claim, number))))
}

/// The study's RUNNING trials that runs other than `run_id` hold (or no
/// run: an Optuna process's), less those a pruner holds below a cut (whose
/// latest priority with a rung pauses them), as a sync counts them.
async fn in_flight_elsewhere(
    conn: &mut AnyConnection,
    study_id: StudyId,
    run_id: RunId,
) -> std::result::Result<u64, sqlx::Error> {
    let count: i64 = sqlx::query_scalar(&sql(
        &*conn,
        &format!(
            "SELECT COUNT(*) FROM trials t LEFT JOIN salus_claims c ON c.trial_id = t.trial_id \
             WHERE t.study_id = ? AND t.state = 'RUNNING' AND (c.run_id IS NULL OR c.run_id <> ?) \
             AND NOT EXISTS (SELECT 1 FROM salus_priority p WHERE p.trial_id = t.trial_id AND {HELD_BELOW_CUT})"
        ),
    ))
    .bind(study_id)
    .bind(run_id)
    .fetch_one(&mut *conn)
    .await?;
    Ok(count as u64)
}

/// Holds the study until the transaction ends, so that what a process
/// reads and then writes (the next trial number, a free process index) no
/// other process reads meanwhile. SQLite's `BEGIN IMMEDIATE` already holds
/// the database's write lock; PostgreSQL locks the study's row `FOR NO KEY
/// UPDATE`: it excludes the other processes' same lock, but not the key
/// share that every insert referencing the study (an event, a trial)
/// takes, which `FOR UPDATE` would wait on; two processes that had both
/// inserted an event would then each wait for the other, a deadlock.
async fn lock_study(
    conn: &mut AnyConnection,
    study_id: StudyId,
) -> std::result::Result<(), sqlx::Error> {
    if Dialect::of(conn) == Dialect::Postgres {
        sqlx::query("SELECT study_id FROM studies WHERE study_id = $1 FOR NO KEY UPDATE")
            .bind(study_id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The number the study's next trial takes: its count of trials, the
/// study held ([`lock_study`]) so that two processes never take the same.
pub(super) async fn next_number(
    conn: &mut AnyConnection,
    study_id: StudyId,
) -> std::result::Result<TrialNumber, sqlx::Error> {
    lock_study(conn, study_id).await?;
    let count: i64 =
        sqlx::query_scalar(&sql(conn, "SELECT COUNT(*) FROM trials WHERE study_id = ?"))
            .bind(study_id)
            .fetch_one(&mut *conn)
            .await?;
    Ok(TrialNumber(count))
}

/// A trial's parameters; one it has already stays.
pub(super) async fn insert_params(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    params: &[StoredParam],
) -> std::result::Result<(), sqlx::Error> {
    for p in params.iter() {
        sqlx::query(&sql(&*conn, "INSERT INTO trial_params (trial_id, param_name, param_value, distribution_json) VALUES (?, ?, ?, ?) \
             ON CONFLICT (trial_id, param_name) DO NOTHING",))
        .bind(trial_id)
        .bind(&p.name)
        .bind(p.internal)
        .bind(&p.distribution_json)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// See [`WriteOp::Exploit`].
pub(super) async fn pbt_exploit(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    e: &super::writer::PbtExploit,
    time: &str,
) -> std::result::Result<(), sqlx::Error> {
    for p in &e.params {
        sqlx::query(&sql(
            &*conn,
            "UPDATE trial_params SET param_value = ? WHERE trial_id = ? AND param_name = ?",
        ))
        .bind(p.internal)
        .bind(trial_id)
        .bind(&p.name)
        .execute(&mut *conn)
        .await?;
    }
    sqlx::query(&sql(&*conn, "INSERT INTO salus_pbt_events (study_id, trial_id, donor_trial_id, generation, step, iteration, \
         old_params, new_params, resampled, bytes, seconds, on_device, time) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?::timestamp)"))
    .bind(e.study_id)
    .bind(trial_id)
    .bind(e.donor)
    .bind(e.generation)
    .bind(e.step)
    .bind(e.iteration)
    .bind(&e.old_params)
    .bind(&e.new_params)
    .bind(&e.resampled)
    .bind(e.bytes)
    .bind(e.seconds)
    .bind(e.on_device)
    .bind(time)
    .execute(&mut *conn)
    .await?;
    let donor: Option<String> = sqlx::query_scalar(&sql(
        &*conn,
        "SELECT value_json FROM trial_user_attributes WHERE trial_id = ? AND \"key\" = ?",
    ))
    .bind(e.donor)
    .bind(PBT_SCHEDULE)
    .fetch_optional(&mut *conn)
    .await?;
    let mut schedule: Vec<serde_json::Value> = donor
        .and_then(|d| serde_json::from_str(&d).ok())
        .unwrap_or_default();
    schedule.extend(serde_json::from_str::<serde_json::Value>(&e.schedule_entry).ok());
    let json = serde_json::Value::Array(schedule).to_string();
    set_trial_attr(conn, Attrs::User, trial_id, PBT_SCHEDULE, &json).await
}

/// See [`WriteOp::PbtPoint`](super::writer::WriteOp::PbtPoint). A member
/// resumed behind a point it had reached writes it again.
pub(super) async fn pbt_point(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    p: &super::writer::PbtPoint,
    time: &str,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(&sql(
        &*conn,
        "DELETE FROM salus_pbt_points WHERE trial_id = ? AND generation = ?",
    ))
    .bind(trial_id)
    .bind(p.generation)
    .execute(&mut *conn)
    .await?;
    sqlx::query(&sql(
        &*conn,
        "INSERT INTO salus_pbt_points (study_id, trial_id, generation, step, iteration, value, \
         params, state_file, time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?::timestamp)",
    ))
    .bind(p.study_id)
    .bind(trial_id)
    .bind(p.generation)
    .bind(p.step)
    .bind(p.iteration)
    .bind(p.value.filter(|v| v.is_finite()))
    .bind(&p.params)
    .bind(
        p.state
            .as_ref()
            .map(|(path, _)| path.to_string_lossy().into_owned()),
    )
    .bind(time)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A PBT member's schedule: what its weights were trained with, step by step.
const PBT_SCHEDULE: &str = "pbt:schedule";

/// See [`WriteOp::ScheduleStart`].
pub(super) async fn schedule_start(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    schedule_json: &str,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(&sql(
        &*conn,
        "INSERT INTO trial_user_attributes (trial_id, \"key\", value_json) VALUES (?, ?, ?) \
         ON CONFLICT (trial_id, \"key\") DO NOTHING",
    ))
    .bind(trial_id)
    .bind(PBT_SCHEDULE)
    .bind(schedule_json)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A trial ends: its state, Optuna value, fail reason and totals.
pub(super) async fn finish_trial(
    conn: &mut AnyConnection,
    end: &TrialEnd,
    time: &str,
) -> std::result::Result<(), sqlx::Error> {
    let TrialEnd {
        claim,
        state,
        value,
        more_values,
        constraints,
        iterations,
        device_seconds,
        fail_reason,
    } = end;
    let trial_id = &claim.trial_id;
    // The claim holds, so the trial is RUNNING; the state check is a
    // second line, never the first.
    let changed = sqlx::query(&sql(&*conn, "UPDATE trials SET state = ?::trialstate, datetime_complete = ?::timestamp WHERE trial_id = ? AND state = 'RUNNING'"))
        .bind(state.as_str())
        .bind(time)
        .bind(*trial_id)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if changed == 0 {
        return Ok(());
    }
    record_write(conn, claim, "end", 0).await?;
    let values = value.iter().chain(more_values.iter());
    for (objective, value) in values.enumerate() {
        let (v, kind) = optuna_value(*value, false);
        sqlx::query(&sql(&*conn, "INSERT INTO trial_values (trial_id, objective, value, value_type) VALUES (?, ?, NULLIF(?::float8, 'NaN'), ?::trialvaluetype) \
                 ON CONFLICT (trial_id, objective) DO UPDATE SET value = excluded.value, value_type = excluded.value_type",))
            .bind(*trial_id)
            .bind(objective as i64)
            .bind(nan_for_null(v))
            .bind(kind)
            .execute(&mut *conn)
            .await?;
    }
    for (key, c) in constraints {
        // Optuna's `trial.set_constraint(key, value)`: `constraints:KEY`.
        let json = serde_json::to_string(c).unwrap_or_else(|_| "null".into());
        set_trial_attr(
            conn,
            Attrs::System,
            *trial_id,
            &format!("constraints:{key}"),
            &json,
        )
        .await?;
    }
    if let Some(reason) = fail_reason {
        sqlx::query(&sql(&*conn, "INSERT INTO trial_system_attributes (trial_id, \"key\", value_json) VALUES (?, 'fail_reason', ?) ON CONFLICT (trial_id, \"key\") DO UPDATE SET value_json = excluded.value_json"))
                .bind(*trial_id)
                .bind(serde_json::to_string(reason).unwrap())
                .execute(&mut *conn)
                .await?;
    }
    sqlx::query(&sql(&*conn, "UPDATE salus_trials SET iterations = ?, device_seconds = ?, fail_reason = ? WHERE trial_id = ?"))
            .bind(*iterations)
            .bind(*device_seconds)
            .bind(fail_reason.as_deref())
            .bind(*trial_id)
            .execute(&mut *conn)
            .await?;
    let kind = match state {
        TrialState::Complete => "trial_complete",
        TrialState::Pruned => "trial_pruned",
        _ => "trial_fail",
    };
    study_event(
        &mut *conn,
        *trial_id,
        kind,
        &serde_json::json!({ "state": state.as_str(), "value": value, "reason": fail_reason })
            .to_string(),
        time,
    )
    .await?;
    Ok(())
}

/// The dashboard's unapplied commands for the trials run `run_id` holds
/// and for finished trials (nobody else would take those), marked applied
/// by it, in the order they were given. Commands for a trial another run
/// holds stay for that run; those for a WAITING trial, for whoever claims it.
pub(super) async fn take_commands(
    conn: &mut AnyConnection,
    study_id: StudyId,
    run_id: RunId,
    time: &str,
) -> std::result::Result<Option<Answer>, sqlx::Error> {
    // PostgreSQL: the claims are share-locked, so that a requeue (which
    // updates its claim) cannot slip between this check and the take.
    let lock = match Dialect::of(conn) {
        Dialect::Postgres => " FOR SHARE",
        Dialect::Sqlite => "",
    };
    let rows = sqlx::query(&sql(
        &*conn,
        &format!(
            "UPDATE salus_commands SET applied = ?::timestamp, applied_by = ? \
             WHERE study_id = ? AND applied IS NULL AND ( \
               trial_id IN (SELECT trial_id FROM salus_claims WHERE run_id = ? AND released IS NULL{lock}) \
               OR trial_id IN (SELECT trial_id FROM trials WHERE study_id = ? \
                 AND state IN ('COMPLETE', 'PRUNED', 'FAIL'))) \
             RETURNING command_id, trial_id, action"
        ),
    ))
    .bind(time)
    .bind(run_id)
    .bind(study_id)
    .bind(run_id)
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await?;
    // In the same transaction: the events' order says which claim was
    // current when each command was taken.
    for r in &rows {
        let detail = serde_json::json!({ "command_id": r.get::<i64, _>(0), "run_id": run_id });
        event(
            &mut *conn,
            study_id,
            Some(r.get(1)),
            "command_taken",
            &detail.to_string(),
            time,
        )
        .await?;
    }
    let mut cmds: Vec<TakenCommand> = rows
        .iter()
        .map(|r| {
            let word: String = r.get(2);
            TakenCommand {
                command_id: r.get(0),
                trial_id: r.get(1),
                action: DashCommand::parse(&word),
                word,
            }
        })
        .collect();
    cmds.sort_by_key(|c| c.command_id);
    Ok(Some(Answer::Commands(cmds)))
}

/// What came of command `command_id`.
pub(super) async fn command_outcome(
    conn: &mut AnyConnection,
    command_id: i64,
    outcome: &str,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(&sql(
        &*conn,
        "UPDATE salus_commands SET outcome = ? WHERE command_id = ?",
    ))
    .bind(outcome)
    .bind(command_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Records who wrote item (`kind`, `step`) of the claim's trial.
pub(super) async fn record_write(
    conn: &mut AnyConnection,
    claim: &Claim,
    kind: &str,
    step: i64,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(&sql(
        &*conn,
        "INSERT INTO salus_writes (trial_id, kind, step, run_id, attempt) VALUES (?, ?, ?, ?, ?) \
         ON CONFLICT (trial_id, kind, step) DO UPDATE SET run_id = excluded.run_id, attempt = excluded.attempt",
    ))
    .bind(claim.trial_id)
    .bind(kind)
    .bind(step)
    .bind(claim.run_id)
    .bind(claim.attempt)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// [`record_write`] only while `claim` is its trial's current claim: one
/// statement that is both the fence's check and the record (the commonest
/// write, a step, costs no separate check). On PostgreSQL the claim's row
/// is share-locked, as `claims::holds` locks it. Returns whether it held.
pub(super) async fn record_write_fenced(
    conn: &mut AnyConnection,
    claim: &Claim,
    kind: &str,
    step: i64,
) -> std::result::Result<bool, sqlx::Error> {
    let lock = match Dialect::of(conn) {
        Dialect::Postgres => " FOR SHARE",
        Dialect::Sqlite => "",
    };
    let written = sqlx::query(&sql(
        &*conn,
        &format!(
            "INSERT INTO salus_writes (trial_id, kind, step, run_id, attempt) SELECT ?, ?, ?, ?, ? \
             WHERE EXISTS (SELECT 1 FROM salus_claims WHERE trial_id = ? AND run_id = ? AND attempt = ? \
             AND released IS NULL{lock}) \
             ON CONFLICT (trial_id, kind, step) DO UPDATE SET run_id = excluded.run_id, attempt = excluded.attempt"
        ),
    ))
    .bind(claim.trial_id)
    .bind(kind)
    .bind(step)
    .bind(claim.run_id)
    .bind(claim.attempt)
    .bind(claim.trial_id)
    .bind(claim.run_id)
    .bind(claim.attempt)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(written > 0)
}

/// The trial's checkpoint is now the claim's, covering steps up to `step`.
pub(super) async fn record_checkpoint(
    conn: &mut AnyConnection,
    claim: &Claim,
    step: i64,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(&sql(
        &*conn,
        "INSERT INTO salus_checkpoints (trial_id, run_id, attempt, step) VALUES (?, ?, ?, ?) \
         ON CONFLICT (trial_id) DO UPDATE SET run_id = excluded.run_id, attempt = excluded.attempt, \
         step = excluded.step",
    ))
    .bind(claim.trial_id)
    .bind(claim.run_id)
    .bind(claim.attempt)
    .bind(step)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
