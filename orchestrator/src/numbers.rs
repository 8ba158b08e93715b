//! Numbers as people read them, for every place that shows one (study
//! summaries, tables, the dashboard); below the study and the output, so
//! neither depends on the other for it.

/// A float for people: 6 decimals, or 4 significant digits in scientific
/// form when it is small or large.
pub fn fmt_float(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e6) {
        format!("{v:.3e}")
    } else {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}
