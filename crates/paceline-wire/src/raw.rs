//! A raw HTTP/1.x response as text (what `curl -i` prints or a capture
//! holds) split into status, headers and body, leniently.
//!
//! Accepted: CRLF or LF line ends, `HTTP/1.0`, `HTTP/1.1` and `HTTP/2`
//! status lines, a missing reason phrase, obsolete line folding (a line
//! starting with a space or tab continues the previous header), interim
//! `1xx` responses before the final one, `curl -v` style `< ` prefixes, a
//! missing blank line or body. Header lines that cannot be a field are
//! skipped and reported.
//!
//! ```
//! use paceline_wire::raw::parse_raw_response;
//!
//! let r = parse_raw_response(b"HTTP/1.1 429 Too Many Requests\nRetry-After: 5\n\n{}").unwrap();
//! assert_eq!(r.status, 429);
//! assert_eq!(r.headers["retry-after"], "5");
//! assert_eq!(r.body, b"{}");
//! ```

use http::{HeaderMap, HeaderName, HeaderValue};

/// A response split into its parts.
#[derive(Clone, Debug, Default)]
pub struct RawResponse {
    /// The status code.
    pub status: u16,
    /// The header fields, in order.
    pub headers: HeaderMap,
    /// The body (possibly empty).
    pub body: Vec<u8>,
    /// Lines that were skipped, and why.
    pub skipped: Vec<String>,
}

/// The most header fields kept from one response; the rest are skipped.
pub const MAX_FIELDS: usize = 1_000;

/// Splits `input` into status, headers and body.
///
/// Errors only when no status line can be found.
pub fn parse_raw_response(input: &[u8]) -> Result<RawResponse, String> {
    if let Some(start) = find_curl_verbose(input) {
        return parse_curl_verbose(&input[start..]);
    }
    let mut rest = skip_leading_blank(input);
    loop {
        let (head, body) = split_head(rest);
        let mut lines = head_lines(head);
        let first = lines.next().ok_or("empty input: no status line")?;
        let status = status_line(&first)?;
        // Interim 1xx heads, a proxy's `200 Connection established` and the
        // earlier hops of `curl -iL` come before the response that counts.
        // A later head counts only after an interim, a tunnel's 2xx or a
        // redirect: a final answer's body never replaces the answer.
        if !body.is_empty()
            && (is_interim(status) || (starts_response(body) && (200..400).contains(&status)))
        {
            rest = skip_leading_blank(body);
            continue;
        }
        let mut out = RawResponse {
            status,
            ..RawResponse::default()
        };
        fill_headers(&mut out, lines);
        out.body = body.to_vec();
        return Ok(out);
    }
}

/// Where the last `< HTTP/` line starts (the final response of `curl -v`,
/// after any interim or redirected ones).
fn find_curl_verbose(input: &[u8]) -> Option<usize> {
    // only a transcript that starts like one: curl's `*`, `>` or `<` lines
    let first = input.iter().find(|b| !b.is_ascii_whitespace())?;
    if !matches!(first, b'*' | b'>' | b'<') {
        return None;
    }
    let pat = b"< HTTP/";
    let later = input
        .windows(pat.len() + 1)
        .rposition(|w| w[0] == b'\n' && &w[1..] == pat)
        .map(|i| i + 1);
    later.or(input.starts_with(pat).then_some(0))
}

/// `curl -v`: the head is every line starting with `<`; the body follows
/// with or without a blank line; curl's own `*` lines are dropped.
fn parse_curl_verbose(input: &[u8]) -> Result<RawResponse, String> {
    let mut head = Vec::new();
    let mut rest = input;
    let mut interim = false;
    while let Some(line) = rest.strip_prefix(b"<") {
        let end = line
            .iter()
            .position(|c| *c == b'\n')
            .map_or(line.len(), |i| i + 1);
        let text = line[..end].strip_prefix(b" ").unwrap_or(&line[..end]);
        rest = &line[end..];
        let blank = text.trim_ascii().is_empty();
        if interim && !blank {
            interim = false;
            head.clear();
        }
        if blank {
            // The end of an interim 1xx head: a final one follows.
            let first = head.split(|c| *c == b'\n').next().unwrap_or(&[]);
            let code = status_line(&String::from_utf8_lossy(first)).unwrap_or(0);
            interim = (100..200).contains(&code) && code != 101;
            if !interim {
                break;
            }
            continue;
        }
        head.extend_from_slice(text);
    }
    let body: Vec<u8> = rest
        .split_inclusive(|c| *c == b'\n')
        .filter(|l| !l.starts_with(b"* ") && !l.starts_with(b"{ [") && !l.starts_with(b"} ["))
        .flatten()
        .copied()
        .collect();
    if !head.ends_with(b"\n") {
        head.push(b'\n');
    }
    head.push(b'\n');
    let mut r = parse_raw_response_plain(&head)?;
    r.body = body;
    Ok(r)
}

fn parse_raw_response_plain(input: &[u8]) -> Result<RawResponse, String> {
    let (head, _) = split_head(skip_leading_blank(input));
    let mut lines = head_lines(head);
    let first = lines.next().ok_or("empty input: no status line")?;
    let status = status_line(&first)?;
    let mut out = RawResponse {
        status,
        ..RawResponse::default()
    };
    fill_headers(&mut out, lines);
    Ok(out)
}

fn fill_headers(out: &mut RawResponse, lines: impl Iterator<Item = String>) {
    let mut fields: Vec<(String, String)> = Vec::new();
    for line in lines {
        if line.starts_with([' ', '\t']) {
            match fields.last_mut() {
                Some((_, v)) => {
                    v.push(' ');
                    v.push_str(line.trim());
                }
                None => out.skipped.push(format!(
                    "continuation line without a field: {}",
                    clip(&line)
                )),
            }
            continue;
        }
        match line.split_once(':') {
            Some((n, v)) if !n.is_empty() && !n.ends_with([' ', '\t']) => {
                fields.push((n.to_string(), v.trim().to_string()))
            }
            _ => out
                .skipped
                .push(format!("not a header field: {}", clip(&line))),
        }
    }
    for (n, v) in fields {
        match (
            HeaderName::from_bytes(n.as_bytes()),
            HeaderValue::from_str(&v),
        ) {
            (Ok(_), Ok(_)) if out.headers.len() >= MAX_FIELDS => out.skipped.push(format!(
                "more than {MAX_FIELDS} header fields: {}",
                clip(&n)
            )),
            (Ok(n), Ok(v)) => {
                out.headers.append(n, v);
            }
            _ => out
                .skipped
                .push(format!("invalid header field: {}", clip(&n))),
        }
    }
}

fn clip(s: &str) -> String {
    let mut end = s.len().min(60);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}", &s[..end])
}

fn skip_leading_blank(mut b: &[u8]) -> &[u8] {
    while let [b' ' | b'\t' | b'\r' | b'\n', rest @ ..] = b {
        b = rest;
    }
    b
}

/// Splits at the first empty line (CRLF or LF).
fn split_head(b: &[u8]) -> (&[u8], &[u8]) {
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\n' {
            let j = i + 1;
            if b.get(j) == Some(&b'\n') {
                return (&b[..i], &b[j + 1..]);
            }
            if b.get(j) == Some(&b'\r') && b.get(j + 1) == Some(&b'\n') {
                return (&b[..i], &b[j + 2..]);
            }
        }
        i += 1;
    }
    (b, &[])
}

fn head_lines(head: &[u8]) -> impl Iterator<Item = String> + '_ {
    head.split(|c| *c == b'\n').map(|l| {
        let l = l.strip_suffix(b"\r").unwrap_or(l);
        String::from_utf8_lossy(l).into_owned()
    })
}

fn is_interim(status: u16) -> bool {
    (100..200).contains(&status) && status != 101
}

/// Whether `body` is really another response head.
fn starts_response(body: &[u8]) -> bool {
    let b = skip_leading_blank(body);
    let end = b.iter().position(|c| *c == b'\n').unwrap_or(b.len());
    b.starts_with(b"HTTP/") && status_line(&String::from_utf8_lossy(&b[..end])).is_ok()
}

fn status_line(line: &str) -> Result<u16, String> {
    let mut parts = line.split_whitespace();
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/") {
        return Err(format!("not a status line: {}", clip(line)));
    }
    let code = parts.next().unwrap_or("");
    match code.parse::<u16>() {
        Ok(c) if code.len() == 3 && (100..=999).contains(&c) => Ok(c),
        _ => Err(format!("bad status code in {}", clip(line))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crlf_lf_fold_and_interim() {
        let r = parse_raw_response(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\nX-A: 1\r\nX-B: two\r\n  parts\r\n\r\nbody",
        )
        .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["x-b"], "two parts");
        assert_eq!(r.body, b"body");
        let r = parse_raw_response(b"HTTP/2 429\nretry-after: 3").unwrap();
        assert_eq!(r.status, 429);
        assert_eq!(r.headers["retry-after"], "3");
        assert!(r.body.is_empty());
    }

    #[test]
    fn the_last_response_of_a_chain_counts() {
        let r = parse_raw_response(
            b"HTTP/1.1 301 Moved Permanently\r\nLocation: /b\r\n\r\nHTTP/2 429\r\nretry-after: 4\r\n\r\n{}",
        )
        .unwrap();
        assert_eq!(r.status, 429);
        assert_eq!(r.body, b"{}");
        let r = parse_raw_response(
            b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 503 Service Unavailable\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.status, 503);
    }

    #[test]
    fn curl_verbose_and_junk() {
        let r = parse_raw_response(b"< HTTP/1.1 503 Service Unavailable\n< Retry-After: 7\n<\n")
            .unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.headers["retry-after"], "7");
        // Discord's documented 429 is written this way, body straight after.
        let r = parse_raw_response(
            b"* Trying\n> GET / HTTP/1.1\n>\n< HTTP/1.1 429 TOO MANY REQUESTS\n< Retry-After: 65\n{\"global\": false}\n* Connection #0 left intact\n",
        )
        .unwrap();
        assert_eq!(r.status, 429);
        assert_eq!(r.headers["retry-after"], "65");
        assert_eq!(r.body, b"{\"global\": false}\n");
        // curl -vL: the last response counts.
        let r = parse_raw_response(
            b"< HTTP/1.1 302 Found\n< Location: /x\n<\n* Issue another request\n> GET /x HTTP/1.1\n>\n< HTTP/1.1 429 Too Many Requests\n< Retry-After: 9\n<\n",
        )
        .unwrap();
        assert_eq!(
            (r.status, r.headers["retry-after"].to_str().unwrap()),
            (429, "9")
        );
        let r =
            parse_raw_response(b"HTTP/1.1 200 OK\nnot a header\nBad Name: x\nok: 1\n\n").unwrap();
        assert_eq!(r.skipped.len(), 2);
        assert_eq!(r.headers["ok"], "1");
        assert!(parse_raw_response(b"").is_err());
        assert!(parse_raw_response(b"hello").is_err());
        assert!(parse_raw_response(b"HTTP/1.1 20 OK").is_err());
    }
}
