//! The dashboard's own state (selection, sort, filter, focus) and how keys
//! change it: pure functions, tested without a terminal.

use super::snapshot::{Phase, Snapshot, TrialInfo};
use crate::storage::dashboard::DashCommand;
use crate::storage::{TrialId, TrialNumber};

/// The panes Tab moves between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pane {
    Trials,
    Device,
    Charts,
    Detail,
}

impl Pane {
    fn next(self) -> Pane {
        match self {
            Pane::Trials => Pane::Device,
            Pane::Device => Pane::Charts,
            Pane::Charts => Pane::Detail,
            Pane::Detail => Pane::Trials,
        }
    }
}

/// Columns the trials table sorts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Number,
    State,
    Metric,
    Rung,
    Priority,
    Speed,
}

impl SortKey {
    const ALL: [SortKey; 6] = [
        SortKey::Number,
        SortKey::State,
        SortKey::Metric,
        SortKey::Rung,
        SortKey::Priority,
        SortKey::Speed,
    ];
    pub fn label(self) -> &'static str {
        match self {
            SortKey::Number => "number",
            SortKey::State => "state",
            SortKey::Metric => "metric",
            SortKey::Rung => "rung",
            SortKey::Priority => "priority",
            SortKey::Speed => "it/s",
        }
    }
    fn next(self) -> SortKey {
        let i = Self::ALL.iter().position(|&k| k == self).unwrap_or(0);
        Self::ALL[(i + 1) % Self::ALL.len()]
    }
}

/// Which trials the table lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    All,
    Live,
    Complete,
    Pruned,
    Failed,
}

impl StateFilter {
    pub fn label(self) -> &'static str {
        match self {
            StateFilter::All => "all",
            StateFilter::Live => "live",
            StateFilter::Complete => "complete",
            StateFilter::Pruned => "pruned",
            StateFilter::Failed => "failed",
        }
    }
    fn next(self) -> StateFilter {
        match self {
            StateFilter::All => StateFilter::Live,
            StateFilter::Live => StateFilter::Complete,
            StateFilter::Complete => StateFilter::Pruned,
            StateFilter::Pruned => StateFilter::Failed,
            StateFilter::Failed => StateFilter::All,
        }
    }
    fn admits(self, p: Phase) -> bool {
        match self {
            StateFilter::All => true,
            StateFilter::Live => p.is_live() || p == Phase::Waiting,
            StateFilter::Complete => p == Phase::Complete,
            StateFilter::Pruned => p == Phase::Pruned,
            StateFilter::Failed => p == Phase::Failed,
        }
    }
}

/// What a key asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Quit,
    Help,
    Up,
    Down,
    PageUp,
    PageDown,
    Top,
    Bottom,
    NextPane,
    Sort,
    ReverseSort,
    CycleFilter,
    StartSearch,
    ToggleDetail,
    /// `pause`, `resume` or `prune` the selected trial.
    Command(DashCommand),
    /// The next or previous trial on the Pareto front (several objectives).
    FrontNext,
    FrontPrev,
    /// Plot the next objective against the first.
    NextObjective,
    /// A character typed into the search box.
    Type(char),
    Backspace,
    Submit,
    Cancel,
    None,
}

/// A key as the dashboard sees it (terminal-independent, for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Ctrl(char),
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    Tab,
    Enter,
    Esc,
    Backspace,
}

/// The dashboard's state. See the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewState {
    /// The selected trial, by number (stable across refreshes).
    pub selected: Option<TrialNumber>,
    pub focus: Pane,
    pub sort: SortKey,
    pub descending: bool,
    pub filter: StateFilter,
    /// Text a trial's state or parameters must contain.
    pub search: String,
    /// Typing into the search box.
    pub searching: bool,
    pub help: bool,
    /// The bottom pane shows the selected trial's detail instead of charts.
    pub detail: bool,
    /// A line for the status bar (the last command sent, an error).
    pub message: String,
    /// A study of several objectives: the objective the Pareto chart
    /// plots upward (against the first).
    pub front_y: usize,
}

impl Default for ViewState {
    fn default() -> Self {
        ViewState {
            selected: None,
            focus: Pane::Trials,
            sort: SortKey::Number,
            descending: false,
            filter: StateFilter::All,
            search: String::new(),
            searching: false,
            help: false,
            detail: false,
            message: String::new(),
            front_y: 1,
        }
    }
}

/// Maps a key to an action; while searching, keys type.
pub fn action(state: &ViewState, key: Key) -> Action {
    if state.searching {
        return match key {
            Key::Enter => Action::Submit,
            Key::Esc => Action::Cancel,
            Key::Backspace => Action::Backspace,
            Key::Char(c) => Action::Type(c),
            Key::Ctrl('c') => Action::Quit,
            _ => Action::None,
        };
    }
    if state.help {
        return match key {
            Key::Char('q') | Key::Ctrl('c') => Action::Quit,
            _ => Action::Help,
        };
    }
    match key {
        Key::Char('q') | Key::Ctrl('c') => Action::Quit,
        Key::Char('?') => Action::Help,
        Key::Up | Key::Char('k') => Action::Up,
        Key::Down | Key::Char('j') => Action::Down,
        Key::PageUp => Action::PageUp,
        Key::PageDown => Action::PageDown,
        Key::Home | Key::Char('g') => Action::Top,
        Key::End | Key::Char('G') => Action::Bottom,
        Key::Tab => Action::NextPane,
        Key::Char('s') => Action::Sort,
        Key::Char('S') => Action::ReverseSort,
        Key::Char('f') => Action::CycleFilter,
        Key::Char('/') => Action::StartSearch,
        Key::Enter | Key::Char('d') => Action::ToggleDetail,
        Key::Char('p') => Action::Command(DashCommand::Pause),
        Key::Char('r') => Action::Command(DashCommand::Resume),
        Key::Char('x') => Action::Command(DashCommand::Prune),
        Key::Char(']') => Action::FrontNext,
        Key::Char('[') => Action::FrontPrev,
        Key::Char('o') => Action::NextObjective,
        Key::Esc => Action::Cancel,
        _ => Action::None,
    }
}

fn cmp_opt(a: Option<f64>, b: Option<f64>) -> std::cmp::Ordering {
    match (a, b) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
}

impl ViewState {
    /// The trials the table lists, filtered and sorted.
    pub fn rows<'a>(&self, snap: &'a Snapshot) -> Vec<&'a TrialInfo> {
        let needle = self.search.to_lowercase();
        let mut rows: Vec<&TrialInfo> = snap
            .trials
            .iter()
            .filter(|t| self.filter.admits(t.phase))
            .filter(|t| {
                needle.is_empty()
                    || t.phase.label().to_lowercase().contains(&needle)
                    || t.number.to_string() == needle
                    || t.params
                        .iter()
                        .any(|(n, v)| format!("{n}={v}").to_lowercase().contains(&needle))
            })
            .collect();
        // Missing values sort last in either direction.
        let desc = self.descending;
        let opt = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(x), Some(y)) if desc => y.total_cmp(&x),
            _ => cmp_opt(a, b),
        };
        let ord = |o: std::cmp::Ordering| if desc { o.reverse() } else { o };
        rows.sort_by(|a, b| {
            match self.sort {
                SortKey::Number => ord(a.number.cmp(&b.number)),
                SortKey::State => ord(a.phase.cmp(&b.phase)),
                SortKey::Metric => opt(a.last_metric(), b.last_metric()),
                SortKey::Rung => opt(a.rung.map(|r| r as f64), b.rung.map(|r| r as f64)),
                SortKey::Priority => opt(a.priority, b.priority),
                SortKey::Speed => opt(a.its_per_s, b.its_per_s),
            }
            .then(a.number.cmp(&b.number))
        });
        rows
    }

    /// The selected trial, if it is listed; else the first listed.
    pub fn current<'a>(&self, snap: &'a Snapshot) -> Option<&'a TrialInfo> {
        let rows = self.rows(snap);
        self.selected
            .and_then(|n| rows.iter().find(|t| t.number == n).copied())
            .or_else(|| rows.first().copied())
    }

    /// The objective the Pareto chart plots upward (1 unless `o` moved it).
    pub fn front_axis(&self, snap: &Snapshot) -> usize {
        self.front_y.clamp(1, snap.objectives.len().max(2) - 1)
    }

    /// Selects the next (`delta` 1) or previous trial on the Pareto front,
    /// by the first objective; from a trial off the front, its first one.
    fn along_front(&mut self, snap: &Snapshot, delta: isize) {
        let front = snap.front();
        if front.is_empty() {
            return;
        }
        let to = match self
            .selected
            .and_then(|n| front.iter().position(|&f| f == n))
        {
            Some(at) => (at as isize + delta).clamp(0, front.len() as isize - 1) as usize,
            None => 0,
        };
        self.selected = Some(front[to]);
        // It is listed whatever the table shows.
        self.filter = StateFilter::All;
        self.search.clear();
    }

    fn move_by(&mut self, snap: &Snapshot, delta: isize) {
        let rows = self.rows(snap);
        if rows.is_empty() {
            return;
        }
        let at = self
            .current(snap)
            .and_then(|c| rows.iter().position(|t| t.number == c.number))
            .unwrap_or(0) as isize;
        let to = (at + delta).clamp(0, rows.len() as isize - 1) as usize;
        self.selected = Some(rows[to].number);
    }

    /// Applies an action; returns a command for the running study, if any:
    /// `(trial_id, action)`.
    pub fn apply(&mut self, snap: &Snapshot, action: Action) -> Option<(TrialId, DashCommand)> {
        match action {
            Action::Quit | Action::None => {}
            Action::Help => self.help = !self.help,
            Action::FrontNext => self.along_front(snap, 1),
            Action::FrontPrev => self.along_front(snap, -1),
            Action::NextObjective => {
                let n = snap.objectives.len();
                if n > 2 {
                    self.front_y = 1 + self.front_y.max(1) % (n - 1);
                }
            }
            Action::Up => self.move_by(snap, -1),
            Action::Down => self.move_by(snap, 1),
            Action::PageUp => self.move_by(snap, -10),
            Action::PageDown => self.move_by(snap, 10),
            Action::Top => self.move_by(snap, isize::MIN / 2),
            Action::Bottom => self.move_by(snap, isize::MAX / 2),
            Action::NextPane => {
                self.focus = self.focus.next();
                self.detail =
                    self.focus == Pane::Detail || (self.detail && self.focus != Pane::Charts);
            }
            Action::Sort => self.sort = self.sort.next(),
            Action::ReverseSort => self.descending = !self.descending,
            Action::CycleFilter => self.filter = self.filter.next(),
            Action::StartSearch => self.searching = true,
            Action::ToggleDetail => self.detail = !self.detail,
            Action::Type(c) => self.search.push(c),
            Action::Backspace => {
                self.search.pop();
            }
            Action::Submit => self.searching = false,
            Action::Cancel => {
                if self.searching {
                    self.searching = false;
                    self.search.clear();
                } else {
                    self.help = false;
                }
            }
            Action::Command(what) => {
                let Some(t) = self.current(snap) else {
                    self.message = "no trial selected".into();
                    return None;
                };
                if !snap.running {
                    self.message =
                        "the study is not running: nothing to pause, resume or prune".into();
                    return None;
                }
                if !t.phase.is_live() {
                    self.message = format!(
                        "trial {} is {}: it cannot be {what}d",
                        t.number,
                        t.phase.label()
                    );
                    return None;
                }
                self.message = format!(
                    "{what} sent for trial {}; it acts at the next iteration boundary",
                    t.number
                );
                return Some((t.trial_id, what));
            }
        }
        None
    }
}
