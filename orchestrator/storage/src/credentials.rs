//! Passwords in storage URLs: masked wherever a URL is shown (messages,
//! errors, the dashboard, the database). Its own module because errors and
//! storage both show URLs, and errors must not depend on storage.

/// `url` with any password in it replaced by `***`: the form every
/// message, the dashboard and the database show. Credentials are in the
/// user-info part (`user:secret@host`) or a `password=` parameter.
///
/// A generated password may hold `/`, `?`, `#` or `@` unescaped, which a
/// URL parser would take for the end of the user-info; so the user-info
/// runs here to the *last* `@` (host names have none), and everything
/// after the first `:` in it is the password. Where the query itself holds
/// an `@`, more is masked than needed, never less.
pub fn masked(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.rsplit_once('@') {
        Some((info, after)) => {
            let info = match info.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => info.to_string(),
            };
            (format!("{info}@"), after)
        }
        None => (String::new(), rest),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}
