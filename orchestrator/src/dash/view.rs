//! Drawing: one pure function from a [`Snapshot`] and a [`ViewState`] to a
//! frame. Nothing here reads the database or the terminal, so every widget
//! is tested on ratatui's `TestBackend`.
//!
//! Layout, top to bottom: a study header; the trials table beside the
//! device panel; the charts (or the selected trial's detail); a status
//! line. It fits 80x24 and gives extra room to the table and charts.
//! Selection and focus are shown with reverse video and bold, so the
//! dashboard reads the same without colour.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Axis, Block, Borders, Cell, Chart, Clear, Dataset, GraphType, Paragraph, Row, Sparkline, Table,
    TableState, Wrap,
};

use super::snapshot::{Phase, Snapshot, TrialInfo};
use super::state::{Pane, ViewState};
use crate::numbers::fmt_float;
use crate::study::Direction;

/// Draws the whole dashboard.
pub fn draw(frame: &mut Frame, snap: &Snapshot, view: &ViewState) {
    let area = frame.area();
    let tall = area.height >= 36;
    let [header, middle, bottom, status] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(6),
        Constraint::Length(if tall { 14 } else { 8 }),
        Constraint::Length(1),
    ])
    .areas(area);
    header_widget(frame, header, snap);
    let side = if area.width >= 120 { 36 } else { 32 };
    // Below 100 columns the table takes the whole width, for its
    // parameters, and the device panel moves down beside the charts.
    let (table, device, bottom) = if area.width >= 100 {
        let [table, device] =
            Layout::horizontal([Constraint::Min(40), Constraint::Length(side)]).areas(middle);
        (table, device, bottom)
    } else {
        let [device, charts] =
            Layout::horizontal([Constraint::Length(30), Constraint::Min(20)]).areas(bottom);
        (middle, device, charts)
    };
    // Priority, lane and speed columns from 120 columns, where the
    // parameters keep their room.
    trials_table(frame, table, snap, view, area.width >= 120);
    device_panel(frame, device, snap, view.focus == Pane::Device);
    if view.detail {
        detail_pane(frame, bottom, snap, view);
    } else {
        charts(frame, bottom, snap, view);
    }
    status_line(frame, status, view);
    if view.help {
        help_overlay(frame, area);
    }
}

fn block(title: &str, focused: bool) -> Block<'_> {
    let b = Block::default().borders(Borders::ALL).title(title);
    if focused {
        b.title_style(Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED))
    } else {
        b
    }
}

/// `1m05s`, `2h03m`.
pub fn duration(s: f64) -> String {
    let s = s.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// `512B`, `3.2MiB`.
pub fn bytes(b: i64) -> String {
    let b = b.max(0) as f64;
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b:.0}B")
    } else {
        format!("{v:.1}{}", units[u])
    }
}

/// The items that fit in `width` columns joined by `sep`, in their order;
/// when not all fit, the ones with the lowest `keep` rank go first.
fn fit(items: &[(u8, String)], sep: &str, width: usize) -> Vec<usize> {
    let mut shown: Vec<usize> = (0..items.len()).collect();
    let len = |shown: &[usize]| {
        shown
            .iter()
            .map(|&i| items[i].1.chars().count())
            .sum::<usize>()
            + sep.chars().count() * shown.len().saturating_sub(1)
    };
    while len(&shown) > width && shown.len() > 1 {
        let drop = shown
            .iter()
            .enumerate()
            .min_by_key(|(_, i)| items[**i].0)
            .map(|(at, _)| at)
            .expect("more than one item");
        shown.remove(drop);
    }
    shown
}

fn header_widget(frame: &mut Frame, area: Rect, snap: &Snapshot) {
    let width = area.width as usize;
    let dir = match snap.direction {
        Direction::Maximize => "maximize",
        Direction::Minimize => "minimize",
    };
    let best = snap.best().map_or("best -".into(), |(n, v)| {
        format!("best {} (#{n})", fmt_float(v))
    });
    let status = if snap.running { "running" } else { "stopped" };
    // Ranked by what to keep: the study, its best and its state first; the
    // device (also in the device pane) and the ETA go first at 80 columns.
    let mut items = vec![
        (9, snap.study.clone()),
        (5, format!("{dir} {}", snap.metric)),
        (8, best),
        (7, format!("{status} {}", duration(snap.elapsed_s))),
    ];
    if let Some(s) = snap.eta_s() {
        items.push((2, format!("ETA {}", duration(s))));
    }
    items.push((1, snap.device.clone()));
    let spans: Vec<Span> = fit(&items, " · ", width)
        .into_iter()
        .enumerate()
        .flat_map(|(at, i)| {
            let sep = (at > 0).then(|| Span::raw(" · "));
            let bold = matches!(i, 0 | 2);
            let style = if bold {
                Style::default().add_modifier(Modifier::BOLD)
            } else {
                Style::default()
            };
            sep.into_iter()
                .chain(std::iter::once(Span::styled(items[i].1.clone(), style)))
        })
        .collect();
    let budget = snap
        .budget_trials
        .map_or(String::new(), |b| format!("/{b}"));
    let phases = [
        (Phase::Running, "run"),
        (Phase::Paused, "paused"),
        (Phase::Swapped, "swap"),
        (Phase::Waiting, "wait"),
        (Phase::Complete, "done"),
        (Phase::Pruned, "pruned"),
        (Phase::Failed, "fail"),
    ];
    let counts = |short: bool| {
        phases
            .iter()
            .map(|&(p, s)| {
                let label = if short {
                    s.to_string()
                } else {
                    p.label().to_lowercase()
                };
                format!("{} {label}", snap.count(p))
            })
            .collect::<Vec<_>>()
            .join(" · ")
    };
    let mut line2 = format!("{}{budget} finished · {}", snap.finished(), counts(false));
    if line2.chars().count() > width {
        line2 = format!("{}{budget} finished · {}", snap.finished(), counts(true));
    }
    frame.render_widget(
        Paragraph::new(vec![Line::from(spans), Line::from(line2)]),
        area,
    );
}

/// A parameter value in few characters: 4 significant digits.
fn compact_value(v: &str) -> String {
    let Ok(f) = v.parse::<f64>() else {
        return v.to_string();
    };
    if f.fract() == 0.0 && f.abs() < 1e6 {
        return format!("{f:.0}");
    }
    if f != 0.0 && (f.abs() < 1e-3 || f.abs() >= 1e5) {
        let s = format!("{f:.2e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let m = m.trim_end_matches('0').trim_end_matches('.');
        return format!("{m}e{e}");
    }
    let digits = (3 - f.abs().log10().floor() as i32).clamp(0, 7) as usize;
    let s = format!("{f:.digits$}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The trial's searched parameters, full names and compact values, as many
/// as fit in `width`; `…` says that more are in the detail pane (Enter).
fn key_params(t: &TrialInfo, width: usize) -> String {
    let mut out = String::new();
    for (i, (n, v)) in t.params.iter().enumerate() {
        let item = format!("{n}={}", compact_value(v));
        let last = i + 1 == t.params.len();
        let room = width.saturating_sub(if last { 0 } else { 2 });
        let sep = usize::from(!out.is_empty());
        if out.chars().count() + sep + item.chars().count() > room {
            if !out.is_empty() || width == 0 {
                out.push_str(" …");
            } else {
                out = item
                    .chars()
                    .take(width.saturating_sub(1))
                    .collect::<String>()
                    + "…";
            }
            return out;
        }
        if sep == 1 {
            out.push(' ');
        }
        out += &item;
    }
    out
}

fn trials_table(frame: &mut Frame, area: Rect, snap: &Snapshot, view: &ViewState, wide: bool) {
    let rows = view.rows(snap);
    // A narrow table keeps the rung column only for a study with rungs.
    let rungs = wide || snap.trials.iter().any(|t| t.rung.is_some());
    // What the other columns, their gaps, the borders and the marker take.
    let others = match (wide, rungs) {
        (true, _) => 50,
        (false, true) => 30,
        (false, false) => 25,
    };
    let param_w = area.width.saturating_sub(others) as usize;
    let mut header = if wide {
        vec![
            "#", "state", "params", "metric", "rung", "prio", "lane", "it/s",
        ]
    } else {
        vec!["#", "state", "params", "metric", "rung"]
    };
    header.truncate(if rungs { header.len() } else { 4 });
    let table_rows: Vec<Row> = rows
        .iter()
        .map(|t| {
            let mut cells = vec![
                Cell::from(t.number.to_string()),
                Cell::from(t.phase.label()),
                Cell::from(key_params(t, param_w)),
                Cell::from(
                    t.last_metric()
                        .map_or("-".into(), |m| compact_value(&m.to_string())),
                ),
            ];
            if rungs {
                cells.push(Cell::from(t.rung.map_or("-".into(), |r| r.to_string())));
            }
            if wide {
                cells.push(Cell::from(
                    t.priority.map_or("-".into(), |p| format!("{p:.2}")),
                ));
                cells.push(Cell::from(t.lane.map_or("-".into(), |l| l.to_string())));
                cells.push(Cell::from(
                    t.its_per_s.map_or("-".into(), |s| format!("{s:.0}")),
                ));
            }
            let style = match t.phase {
                Phase::Failed => Style::default().fg(Color::Red),
                Phase::Pruned => Style::default().fg(Color::DarkGray),
                Phase::Paused | Phase::Swapped => Style::default().fg(Color::Yellow),
                _ => Style::default(),
            };
            Row::new(cells).style(style)
        })
        .collect();
    let widths: Vec<Constraint> = if wide {
        vec![
            Constraint::Length(4),
            Constraint::Length(8),
            Constraint::Min(10),
            Constraint::Length(8),
            Constraint::Length(4),
            Constraint::Length(6),
            Constraint::Length(4),
            Constraint::Length(6),
        ]
    } else {
        let mut w = vec![
            Constraint::Length(4),
            Constraint::Length(8),
            Constraint::Min(10),
            Constraint::Length(7),
            Constraint::Length(4),
        ];
        w.truncate(if rungs { 5 } else { 4 });
        w
    };
    let title = format!(
        "Trials ({} shown · sort {}{} · filter {}{})",
        rows.len(),
        view.sort.label(),
        if view.descending { " desc" } else { "" },
        view.filter.label(),
        if view.search.is_empty() {
            String::new()
        } else {
            format!(" /{}", view.search)
        }
    );
    let table = Table::new(table_rows, widths)
        .header(Row::new(header).style(Style::default().add_modifier(Modifier::BOLD)))
        .block(block(&title, view.focus == Pane::Trials))
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
        .highlight_symbol(">");
    let mut state = TableState::default();
    let current = view.current(snap).map(|t| t.number);
    state.select(rows.iter().position(|t| Some(t.number) == current));
    frame.render_stateful_widget(table, area, &mut state);
}

/// `[####====......]`: persistent `#`, ephemeral `=`, free `.`.
pub fn memory_bar(width: usize, budget: i64, persistent: i64, ephemeral: i64) -> String {
    if budget <= 0 || width == 0 {
        return "-".into();
    }
    let cells = |b: i64| ((b.max(0) as f64 / budget as f64) * width as f64).round() as usize;
    let p = cells(persistent).min(width);
    let e = cells(ephemeral).min(width - p);
    format!(
        "{}{}{}",
        "#".repeat(p),
        "=".repeat(e),
        ".".repeat(width - p - e)
    )
}

fn device_panel(frame: &mut Frame, area: Rect, snap: &Snapshot, focused: bool) {
    let b = block("Device", focused);
    let inner = b.inner(area);
    frame.render_widget(b, area);
    let (persistent, ephemeral) = snap.memory();
    let free = (snap.budget_bytes - persistent - ephemeral).max(0);
    let bar_w = inner.width.saturating_sub(2) as usize;
    let groups = snap.fused_groups();
    let used = persistent + ephemeral;
    let pct = if snap.budget_bytes > 0 {
        100.0 * used as f64 / snap.budget_bytes as f64
    } else {
        0.0
    };
    let mut lines = vec![
        Line::from(format!("{} · {}", snap.device, snap.policy)),
        Line::from(format!(
            "[{}]",
            memory_bar(bar_w, snap.budget_bytes, persistent, ephemeral)
        )),
        Line::from(format!(
            "#pers {} =eph {}",
            bytes(persistent),
            bytes(ephemeral)
        )),
        Line::from(format!(".free {} ({pct:.1}% used)", bytes(free))),
        Line::from(format!(
            "groups {} · sw {} · swaps {}",
            if groups.is_empty() {
                "-".into()
            } else {
                groups
                    .iter()
                    .map(|g| g.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            },
            snap.switches(),
            snap.swaps
        )),
    ];
    // A run on several devices: one line each, and each lane says its device.
    let devices = snap.devices();
    for d in &devices {
        lines.push(Line::from(format!(
            "{}: {} live · #pers {}",
            d.name,
            d.trials,
            bytes(d.persistent_bytes)
        )));
    }
    let device_of = |lane: i64| {
        devices
            .iter()
            .find(|d| d.lanes.contains(&lane))
            .map_or(String::new(), |d| format!("{} ", d.name))
    };
    lines.truncate(inner.height as usize);
    let text_h = lines.len() as u16;
    frame.render_widget(
        Paragraph::new(lines),
        Rect {
            height: text_h,
            ..inner
        },
    );
    // One sparkline per lane below: busy % per second over the last minute.
    let bottom = inner.y + inner.height;
    for (y, lane) in (inner.y + text_h..bottom).zip(&snap.lanes) {
        let label = format!("{}L{} ", device_of(lane.lane), lane.lane);
        let lw = label.len() as u16;
        frame.render_widget(Paragraph::new(label), Rect::new(inner.x, y, lw, 1));
        let spark_w = inner.width.saturating_sub(lw) as usize;
        let data: Vec<u64> = lane.busy[lane.busy.len().saturating_sub(spark_w)..].to_vec();
        frame.render_widget(
            Sparkline::default().data(&data).max(100),
            Rect::new(inner.x + lw, y, inner.width.saturating_sub(lw), 1),
        );
    }
}

fn bounds(values: impl Iterator<Item = f64>) -> [f64; 2] {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
            (l.min(v), h.max(v))
        });
    if !lo.is_finite() {
        return [0.0, 1.0];
    }
    let pad = if hi > lo { (hi - lo) * 0.05 } else { 0.5 };
    [lo - pad, hi + pad]
}

fn axis<'a>(title: &'a str, b: [f64; 2]) -> Axis<'a> {
    Axis::default().title(title).bounds(b).labels(vec![
        Line::from(fmt_float(b[0])),
        Line::from(fmt_float(b[1])),
    ])
}

/// A study of several objectives: every COMPLETE trial by the first
/// objective (across) and another (up), the Pareto front joined in bold,
/// and the selected trial marked.
fn front_chart(frame: &mut Frame, area: Rect, snap: &Snapshot, view: &ViewState) {
    let y_axis = view.front_axis(snap);
    let at = |v: &[f64]| (v[0], v[y_axis]);
    let front = snap.front();
    let mut on: Vec<(f64, f64)> = Vec::new();
    let mut off: Vec<(f64, f64)> = Vec::new();
    for t in &snap.trials {
        if let Some(v) = snap.values(t) {
            match front.contains(&t.number) {
                true => on.push(at(&v)),
                false => off.push(at(&v)),
            }
        }
    }
    on.sort_by(|a, b| a.0.total_cmp(&b.0));
    let selected: Vec<(f64, f64)> = view
        .current(snap)
        .and_then(|t| snap.values(t))
        .map(|v| vec![at(&v)])
        .unwrap_or_default();
    let x = bounds(on.iter().chain(&off).map(|p| p.0));
    let y = bounds(on.iter().chain(&off).map(|p| p.1));
    let (xn, yn) = (&snap.objectives[0].0, &snap.objectives[y_axis].0);
    let title = format!("Pareto front ({} trials): {xn} × {yn}", front.len());
    let chart = Chart::new(vec![
        Dataset::default()
            .name("trial")
            .marker(Marker::Dot)
            .graph_type(GraphType::Scatter)
            .data(&off),
        Dataset::default()
            .name("front")
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(Style::default().add_modifier(Modifier::BOLD))
            .data(&on),
        Dataset::default()
            .name("selected")
            .marker(Marker::Block)
            .graph_type(GraphType::Scatter)
            .style(Style::default().add_modifier(Modifier::REVERSED))
            .data(&selected),
    ])
    .block(block(&title, view.focus == Pane::Charts))
    .x_axis(axis(xn, x))
    .y_axis(axis("", y));
    frame.render_widget(chart, area);
}

fn charts(frame: &mut Frame, area: Rect, snap: &Snapshot, view: &ViewState) {
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    // Optimization history: every finished value, and the best so far.
    let mut done: Vec<&TrialInfo> = snap
        .trials
        .iter()
        .filter(|t| t.phase == Phase::Complete && t.value.is_some_and(f64::is_finite))
        .collect();
    done.sort_by_key(|t| t.number);
    let points: Vec<(f64, f64)> = done
        .iter()
        .map(|t| (t.number.0 as f64, t.value.unwrap_or(0.0)))
        .collect();
    let mut best_line = Vec::with_capacity(points.len());
    let mut best: Option<f64> = None;
    for &(x, y) in &points {
        if best.is_none_or(|b| snap.direction.better(y, b)) {
            best = Some(y);
        }
        best_line.push((x, best.unwrap_or(y)));
    }
    let focused = view.focus == Pane::Charts;
    let x = bounds(points.iter().map(|p| p.0).chain([0.0]));
    let y = bounds(points.iter().map(|p| p.1));
    let history = Chart::new(vec![
        Dataset::default()
            .name("trial")
            .marker(Marker::Dot)
            .graph_type(GraphType::Scatter)
            .data(&points),
        Dataset::default()
            .name("best")
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(Style::default().add_modifier(Modifier::BOLD))
            .data(&best_line),
    ])
    .block(block("Optimization history", focused))
    .x_axis(axis("trial", x))
    .y_axis(axis("", y));
    if snap.objectives.len() > 1 {
        front_chart(frame, left, snap, view);
    } else {
        frame.render_widget(history, left);
    }

    // Learning curves: the selected trial and the three best.
    let selected = view.current(snap);
    let mut top: Vec<&TrialInfo> = done.clone();
    top.sort_by(|a, b| {
        let (x, y) = (a.value.unwrap_or(0.0), b.value.unwrap_or(0.0));
        if snap.direction.better(x, y) {
            std::cmp::Ordering::Less
        } else {
            std::cmp::Ordering::Greater
        }
    });
    let mut shown: Vec<&TrialInfo> = selected.into_iter().collect();
    for t in top.into_iter().take(3) {
        if !shown.iter().any(|s| s.number == t.number) {
            shown.push(t);
        }
    }
    let curves: Vec<(String, Vec<(f64, f64)>)> = shown
        .iter()
        .map(|t| {
            (
                format!("#{}", t.number),
                t.curve.iter().map(|&(s, v)| (s as f64, v)).collect(),
            )
        })
        .collect();
    let x = bounds(
        curves
            .iter()
            .flat_map(|c| c.1.iter().map(|p| p.0))
            .chain([0.0]),
    );
    let y = bounds(curves.iter().flat_map(|c| c.1.iter().map(|p| p.1)));
    let sets: Vec<Dataset> = curves
        .iter()
        .enumerate()
        .map(|(i, (name, data))| {
            let d = Dataset::default()
                .name(name.clone())
                .marker(if i == 0 { Marker::Braille } else { Marker::Dot })
                .graph_type(GraphType::Line)
                .data(data);
            if i == 0 {
                d.style(Style::default().add_modifier(Modifier::BOLD))
            } else {
                d
            }
        })
        .collect();
    let title = match selected {
        Some(t) => format!("Learning curves (#{} and the best)", t.number),
        None => "Learning curves".into(),
    };
    let chart = Chart::new(sets)
        .block(block(&title, focused))
        .x_axis(axis("step", x))
        .y_axis(axis("", y));
    frame.render_widget(chart, right);
}

fn detail_pane(frame: &mut Frame, area: Rect, snap: &Snapshot, view: &ViewState) {
    let focused = view.focus == Pane::Detail;
    let Some(t) = view.current(snap) else {
        frame.render_widget(
            Paragraph::new("no trial").block(block("Trial", focused)),
            area,
        );
        return;
    };
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(45), Constraint::Percentage(55)]).areas(area);
    let mut lines: Vec<Line> = vec![Line::from(format!(
        "{} · {} · {}/{} iterations",
        t.phase.label(),
        t.value
            .map_or("no value".into(), |v| format!("value {}", fmt_float(v))),
        t.iterations,
        t.total_iterations
    ))];
    lines.push(Line::from(format!(
        "footprint: {} persistent, {} ephemeral, {} shared",
        bytes(t.persistent_bytes),
        bytes(t.ephemeral_bytes),
        bytes(t.shared_bytes)
    )));
    if !t.fused_with.is_empty() {
        let with: Vec<String> = t.fused_with.iter().map(|n| format!("#{n}")).collect();
        lines.push(Line::from(format!("fused with {}", with.join(" "))));
    }
    if let Some(r) = &t.fail_reason {
        lines.push(Line::from(format!("failed: {r}")));
    }
    // Every parameter at full precision, wrapped: the table shows a part.
    let params: Vec<String> = t.params.iter().map(|(n, v)| format!("{n}={v}")).collect();
    lines.insert(1, Line::from(params.join("  ")));
    let (schedule, attrs): (Vec<_>, Vec<_>) =
        t.user_attrs.iter().partition(|(k, _)| k == "pbt:schedule");
    if !attrs.is_empty() {
        let attrs: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        lines.insert(2, Line::from(format!("attrs: {}", attrs.join("  "))));
    }
    // A PBT member's lineage: where its weights came from, and the values
    // they were trained with from each step on.
    if let Some((_, json)) = schedule.first() {
        lines.extend(schedule_lines(json).into_iter().map(Line::from));
    }
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(block(&format!("Trial #{}", t.number), focused)),
        left,
    );
    // A PBT member's schedule as a line over its steps, above its events.
    let last = t.curve.last().map_or(0, |&(s, _)| s);
    let line = schedule
        .first()
        .and_then(|(_, json)| schedule_line(json, last));
    let right = match &line {
        Some((title, points)) => {
            let [top, rest] =
                Layout::vertical([Constraint::Percentage(50), Constraint::Percentage(50)])
                    .areas(right);
            let x = bounds(points.iter().map(|p| p.0).chain([0.0]));
            let y = bounds(points.iter().map(|p| p.1));
            let set = Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .data(points);
            let chart = Chart::new(vec![set])
                .block(block(title, focused))
                .x_axis(axis("step", x))
                .y_axis(axis("", y));
            frame.render_widget(chart, top);
            rest
        }
        None => right,
    };
    let keep = right.height.saturating_sub(2) as usize;
    let events: Vec<Line> = t.events[t.events.len().saturating_sub(keep)..]
        .iter()
        .map(|e| {
            let time = e.time.get(11..19).unwrap_or(&e.time);
            let detail = if e.detail == "{}" {
                ""
            } else {
                e.detail.as_str()
            };
            Line::from(format!("{time} {} {detail}", e.kind))
        })
        .collect();
    frame.render_widget(
        Paragraph::new(events).block(block("Events", focused)),
        right,
    );
}

/// The knob of a PBT schedule (`pbt:schedule`) that moved furthest (by
/// the ratio of its largest value to its smallest), as a chart title and
/// a step line: each value from the step it was set at to the next, the
/// last one to step `last`. Positive values are drawn as their log10,
/// where a learning rate's moves read alike. None when no knob moved.
fn schedule_line(json: &str, last: i64) -> Option<(String, Vec<(f64, f64)>)> {
    let serde_json::Value::Array(entries) = serde_json::from_str(json).ok()? else {
        return None;
    };
    let steps: Vec<f64> = entries
        .iter()
        .map(|e| e["step"].as_i64().unwrap_or(0) as f64)
        .collect();
    let knobs: std::collections::BTreeSet<String> = entries
        .iter()
        .filter_map(|e| e["params"].as_object())
        .flat_map(|m| m.keys().cloned())
        .collect();
    let series =
        |k: &str| -> Option<Vec<f64>> { entries.iter().map(|e| e["params"][k].as_f64()).collect() };
    let spread = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if lo > 0.0 {
            hi / lo
        } else {
            1.0 + (hi - lo).abs()
        }
    };
    let (knob, values) = knobs
        .iter()
        .filter_map(|k| series(k).map(|v| (k.clone(), v)))
        .filter(|(_, v)| spread(v) > 1.0)
        .max_by(|a, b| spread(&a.1).total_cmp(&spread(&b.1)))?;
    let log = values.iter().all(|&v| v > 0.0);
    let y = |v: f64| if log { v.log10() } else { v };
    let end = (last as f64).max(*steps.last()?);
    let mut points = Vec::with_capacity(2 * values.len());
    for (i, &v) in values.iter().enumerate() {
        let until = steps.get(i + 1).copied().unwrap_or(end);
        points.push((steps[i], y(v)));
        points.push((until, y(v)));
    }
    let title = match log {
        true => format!("Schedule: log10 {knob}"),
        false => format!("Schedule: {knob}"),
    };
    Some((title, points))
}

/// A PBT schedule (`pbt:schedule`) as lines: `step 3 from #5: lr=0.004 ...`.
fn schedule_lines(json: &str) -> Vec<String> {
    let Ok(serde_json::Value::Array(entries)) = serde_json::from_str(json) else {
        return Vec::new();
    };
    let mut out = vec!["pbt schedule:".to_string()];
    for e in entries {
        let from = e["from"]
            .as_i64()
            .map_or(String::new(), |n| format!(" from #{n}"));
        let values: Vec<String> = e["params"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| match v.as_f64() {
                        Some(f) => format!("{k}={}", fmt_float(f)),
                        None => format!("{k}={v}"),
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(format!(
            "  step {}{from}: {}",
            e["step"].as_i64().unwrap_or(0),
            values.join(" ")
        ));
    }
    out
}

fn status_line(frame: &mut Frame, area: Rect, view: &ViewState) {
    let text = if view.searching {
        format!("/{}_  (Enter: apply, Esc: clear)", view.search)
    } else if !view.message.is_empty() {
        view.message.clone()
    } else {
        // At 80 columns the least needed keys give way; `?` lists them all.
        let keys = [
            (9, "?: help"),
            (8, "q: quit"),
            (7, "j/k: select"),
            (4, "Tab: pane"),
            (3, "s: sort"),
            (3, "f: filter"),
            (2, "/: search"),
            (6, "Enter: detail"),
            (5, "p/r/x: pause/resume/prune"),
        ]
        .map(|(k, t)| (k, t.to_string()));
        fit(&keys, "  ", area.width as usize)
            .into_iter()
            .map(|i| keys[i].1.as_str())
            .collect::<Vec<_>>()
            .join("  ")
    };
    frame.render_widget(
        Paragraph::new(text).style(Style::default().add_modifier(Modifier::REVERSED)),
        area,
    );
}

const HELP: &[(&str, &str)] = &[
    ("?", "show or hide this help"),
    (
        "q, Ctrl-C",
        "quit (a study this command runs stops at the next boundary)",
    ),
    ("Up/Down, j/k", "select a trial; PgUp/PgDn, g/G jump"),
    ("Tab", "next pane: trials, device, charts, detail"),
    (
        "[ / ]",
        "several objectives: previous / next trial on the Pareto front",
    ),
    (
        "o",
        "several objectives: plot the next objective against the first",
    ),
    ("s / S", "sort by the next column / reverse the order"),
    ("f", "filter by state: all, live, complete, pruned, failed"),
    (
        "/",
        "search states and parameters (Enter applies, Esc clears)",
    ),
    (
        "Enter, d",
        "the selected trial's detail instead of the charts",
    ),
    ("p / r / x", "pause / resume / prune the selected trial"),
];

fn help_overlay(frame: &mut Frame, area: Rect) {
    let w = area.width.min(76);
    let h = (HELP.len() as u16 + 4).min(area.height);
    let r = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
    let mut lines: Vec<Line> = HELP
        .iter()
        .map(|(k, v)| {
            Line::from(vec![
                Span::styled(
                    format!("{k:<13}"),
                    Style::default().add_modifier(Modifier::BOLD),
                ),
                Span::raw(*v),
            ])
        })
        .collect();
    lines.push(Line::from(""));
    lines.push(Line::from(
        "pause/resume/prune reach the running study through its database",
    ));
    frame.render_widget(Clear, r);
    frame.render_widget(Paragraph::new(lines).block(block("Help", true)), r);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pbt_schedule_reads_as_one_line_per_step() {
        let json = r#"[{"step":0,"params":{"lr":0.01}},{"step":3,"from":5,"params":{"lr":0.008}}]"#;
        assert_eq!(
            super::schedule_lines(json),
            vec![
                "pbt schedule:",
                "  step 0: lr=0.01",
                "  step 3 from #5: lr=0.008"
            ]
        );
        assert!(super::schedule_lines("not json").is_empty());
    }

    #[test]
    fn a_pbt_schedule_draws_the_knob_that_moved_furthest_as_a_step_line() {
        let json = r#"[{"step":0,"params":{"lr":0.1,"weight_decay":0.001}},
            {"step":3,"from":5,"params":{"lr":0.001,"weight_decay":0.002}}]"#;
        let (title, points) = super::schedule_line(json, 12).unwrap();
        assert_eq!(title, "Schedule: log10 lr");
        let want = [(0.0, -1.0), (3.0, -1.0), (3.0, -3.0), (12.0, -3.0)];
        assert_eq!(points.len(), want.len());
        for (p, w) in points.iter().zip(want) {
            assert!(
                (p.0 - w.0).abs() < 1e-12 && (p.1 - w.1).abs() < 1e-12,
                "{points:?}"
            );
        }
        // Nothing moved, or nothing to read: no chart.
        let still = r#"[{"step":0,"params":{"lr":0.1}},{"step":3,"params":{"lr":0.1}}]"#;
        assert!(super::schedule_line(still, 12).is_none());
        assert!(super::schedule_line("[]", 12).is_none());
        assert!(super::schedule_line("not json", 12).is_none());
    }
}
