//! `salus-tune dash`: a live terminal dashboard of a study.
//!
//! It shows the study both as the tuner sees it (trials, values, curves)
//! and as the Salus core sees it (lanes, memory, pauses, swaps). The parts
//! are separate, as in nextest's runner:
//!
//! * [`snapshot`] reads everything from the database, on the dashboard's
//!   own read-only connection, every 500 ms: the dashboard works for a
//!   study another process is running and for a finished one, and never
//!   waits on the writer (SQLite's WAL lets readers and the writer work
//!   at once).
//! * [`state`] holds selection, sort, filter and focus, and maps keys to
//!   actions: pure functions.
//! * [`view`] draws a frame from a snapshot and the state: pure, tested on
//!   ratatui's `TestBackend` with insta snapshots.
//! * This module runs the terminal: it restores it on exit and on a panic
//!   (`ratatui::init`), redraws only when something changed (no flicker),
//!   and sends pause, resume and prune to the running study as rows of
//!   `salus_commands`, which the study's runner takes within 250 ms and
//!   applies at the trial's next iteration boundary.

pub mod snapshot;
pub mod state;
pub mod view;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::error::{Error, Result, TerminalOp};
use crate::storage::Store;
use snapshot::Snapshot;
use state::{Action, Key, ViewState};

/// How often the dashboard rereads the database.
pub const REFRESH: Duration = Duration::from_millis(500);

fn key_of(code: KeyCode, mods: KeyModifiers) -> Option<Key> {
    Some(match code {
        KeyCode::Char(c) if mods.contains(KeyModifiers::CONTROL) => Key::Ctrl(c),
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::PageUp => Key::PageUp,
        KeyCode::PageDown => Key::PageDown,
        KeyCode::Home => Key::Home,
        KeyCode::End => Key::End,
        KeyCode::Tab => Key::Tab,
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Backspace => Key::Backspace,
        _ => return None,
    })
}

/// Runs the dashboard on `url`'s study `name` (the only study when `None`)
/// until `q`. Beside a run of this process (`stop_study`), it waits for the
/// study to appear, and quitting asks the run to stop at the next boundary.
pub async fn run(url: &str, name: Option<&str>, stop_study: Option<Arc<AtomicBool>>) -> Result<()> {
    // Beside a run that is creating the study, wait for it to appear.
    let mut store = loop {
        let opened = match Store::open_existing(url).await {
            Ok(mut s) => s.pick_study(name).await.map(|_| s),
            Err(e) => Err(e),
        };
        match opened {
            Ok(s) => break s,
            Err(_) if stop_study.is_some() => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => return Err(e.into()),
        }
    };
    let info = store.pick_study(name).await?;
    let mut snap = snapshot::load(&mut store, info.id, &info.name, info.direction).await?;
    let mut view = ViewState::default();
    let mut terminal = ratatui::init();
    let result = async {
        let mut last_read = Instant::now();
        let mut dirty = true;
        loop {
            if dirty {
                terminal
                    .draw(|f| view::draw(f, &snap, &view))
                    .map_err(|source| Error::Terminal {
                        op: TerminalOp::Draw,
                        source,
                    })?;
                dirty = false;
            }
            // Input first, so keys feel immediate; the database at REFRESH.
            let wait = REFRESH
                .saturating_sub(last_read.elapsed())
                .min(Duration::from_millis(50));
            let polled = tokio::task::block_in_place(|| event::poll(wait)).map_err(|source| {
                Error::Terminal {
                    op: TerminalOp::Io,
                    source,
                }
            })?;
            if polled {
                match tokio::task::block_in_place(event::read).map_err(|source| {
                    Error::Terminal {
                        op: TerminalOp::Io,
                        source,
                    }
                })? {
                    Event::Key(k) if k.kind != KeyEventKind::Release => {
                        let Some(key) = key_of(k.code, k.modifiers) else {
                            continue;
                        };
                        let act = state::action(&view, key);
                        if act == Action::Quit {
                            break;
                        }
                        if let Some((trial_id, what)) = view.apply(&snap, act)
                            && let Err(e) = store.push_command(info.id, trial_id, what).await
                        {
                            view.message = format!("could not send {what}: {e}");
                        }
                        dirty = true;
                    }
                    Event::Resize(..) => dirty = true,
                    _ => {}
                }
            }
            if last_read.elapsed() >= REFRESH {
                last_read = Instant::now();
                let next = snapshot::load(&mut store, info.id, &info.name, info.direction).await?;
                if next != snap {
                    snap = next;
                    dirty = true;
                }
            }
        }
        Ok::<(), Error>(())
    }
    .await;
    ratatui::restore();
    if let Some(flag) = stop_study {
        flag.store(true, Ordering::SeqCst);
    }
    result
}

/// The snapshot the dashboard would show now, for tests and tools.
pub async fn read(url: &str, name: Option<&str>) -> Result<Snapshot> {
    let mut store = Store::open_existing(url).await?;
    let info = store.pick_study(name).await?;
    snapshot::load(&mut store, info.id, &info.name, info.direction).await
}
