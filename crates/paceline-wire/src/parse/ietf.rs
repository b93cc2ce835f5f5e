//! The IETF draft's structured fields, read without allocating per
//! parameter: `RateLimit-Policy` and `RateLimit` (draft-09 onward: lists of
//! quoted policy names with parameters), the draft-05/06 `RateLimit-Policy`
//! (a list of integers with `w`) and the draft-07 `RateLimit` dictionary.
//!
//! A field that does not parse, or breaks its own constraints (a token where
//! a string is required, a negative or decimal `q`/`w`/`r`/`t`, a missing
//! required parameter, one name listed twice with different values), is
//! rejected whole: the caller records why and uses none of it.
//!
//! Bounded, at RFC 9651's minimums: a List of up to [`MAX_MEMBERS`]
//! members, each with up to [`MAX_PARAMS`] parameters, strings of any
//! length the field's size bound allows (at least 1,024 characters); a
//! field past either count is rejected whole.

use std::borrow::Cow;
use std::convert::Infallible;

use sfv::visitor::{
    EntryVisitor, Ignored, InnerListVisitor, ItemVisitor, ListVisitor, ParameterVisitor,
};
use sfv::{BareItemFromInput, KeyRef, Parser};

/// Members a List may have (RFC 9651: parsers support at least 1,024).
pub(crate) const MAX_MEMBERS: usize = 1_024;

/// Parameters a member may have (RFC 9651: at least 256).
pub(crate) const MAX_PARAMS: usize = 256;

/// A parameter value as far as this module cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Num {
    #[default]
    Absent,
    Int(i64),
    NotInt,
}

/// A bare item as far as this module cares.
#[derive(Default)]
enum Bare<'de> {
    #[default]
    Missing,
    Str(Cow<'de, str>),
    Token(&'de str),
    Int(i64),
    Other,
}

/// One list member as parsed: the bare item and the parameters we use,
/// kept small so that collecting them costs little.
#[derive(Default)]
struct Entry<'de> {
    bare: Bare<'de>,
    inner_list: bool,
    q: Num,
    w: Num,
    r: Num,
    t: Num,
    /// `qu`: `Some(Ok)` a string, `Some(Err)` any other type.
    qu: Option<Result<Cow<'de, str>, ()>>,
    /// Parameters seen (duplicates included).
    params: usize,
}

fn num(v: &BareItemFromInput<'_>) -> Num {
    match v.as_integer() {
        Some(i) => Num::Int(i64::from(i)),
        None => Num::NotInt,
    }
}

fn string<'de>(v: BareItemFromInput<'de>) -> Result<Cow<'de, str>, BareItemFromInput<'de>> {
    match v {
        BareItemFromInput::String(Cow::Borrowed(s)) => Ok(Cow::Borrowed(s.as_str())),
        BareItemFromInput::String(Cow::Owned(s)) => Ok(Cow::Owned(s.as_str().to_owned())),
        other => Err(other),
    }
}

struct Collect<'de>(Vec<Entry<'de>>);

struct EntryRef<'a, 'de>(&'a mut Entry<'de>);

impl<'de> ListVisitor<'de> for Collect<'de> {
    type Out = Vec<Entry<'de>>;
    type Error = Infallible;
    fn entry(&mut self) -> Result<impl EntryVisitor<'de>, Infallible> {
        // past the cap, one more member is kept (so the caller sees the
        // list is too long) and overwritten: memory stays bounded
        if self.0.len() > MAX_MEMBERS {
            self.0.pop();
        }
        self.0.push(Entry::default());
        let last = self.0.len() - 1;
        Ok(EntryRef(&mut self.0[last]))
    }
    fn finish(self) -> Result<Self::Out, Infallible> {
        Ok(self.0)
    }
}

impl<'de> EntryVisitor<'de> for EntryRef<'_, 'de> {
    type Error = Infallible;
    fn item(self) -> Result<impl ItemVisitor<'de>, Infallible> {
        Ok(self)
    }
    fn inner_list(self) -> Result<impl InnerListVisitor<'de>, Infallible> {
        self.0.inner_list = true;
        Ok(Ignored)
    }
}

impl<'de> ItemVisitor<'de> for EntryRef<'_, 'de> {
    type Out = ();
    type Error = Infallible;
    fn bare_item(
        self,
        bare_item: BareItemFromInput<'de>,
    ) -> Result<impl ParameterVisitor<'de, Out = ()>, Infallible> {
        self.0.bare = match string(bare_item) {
            Ok(s) => Bare::Str(s),
            Err(BareItemFromInput::Token(t)) => Bare::Token(t.as_str()),
            Err(other) => match num(&other) {
                Num::Int(i) => Bare::Int(i),
                _ => Bare::Other,
            },
        };
        Ok(self)
    }
}

impl<'de> ParameterVisitor<'de> for EntryRef<'_, 'de> {
    type Out = ();
    type Error = Infallible;
    fn parameter(
        &mut self,
        key: &'de KeyRef,
        value: BareItemFromInput<'de>,
    ) -> Result<(), Infallible> {
        self.0.params += 1;
        // Later duplicates overwrite earlier ones, as RFC 9651 requires.
        match key.as_str() {
            "q" => self.0.q = num(&value),
            "w" => self.0.w = num(&value),
            "r" => self.0.r = num(&value),
            "t" => self.0.t = num(&value),
            "qu" => self.0.qu = Some(string(value).map_err(|_| ())),
            _ => {}
        }
        Ok(())
    }
    fn finish(self) -> Result<(), Infallible> {
        Ok(())
    }
}

fn parse_list(value: &str) -> Result<Vec<Entry<'_>>, String> {
    let entries = match fast_list(value) {
        Some(entries) => entries,
        None => Parser::new(value)
            .parse_list_with_visitor(Collect(Vec::with_capacity(4)))
            .map_err(|e| format!("not a structured-field list: {e}"))?,
    };
    if entries.len() > MAX_MEMBERS {
        return Err(format!(
            "a list of {} members (at most {MAX_MEMBERS} are read)",
            entries.len()
        ));
    }
    if let Some(e) = entries.iter().find(|e| e.params > MAX_PARAMS) {
        return Err(format!(
            "a member with {} parameters (at most {MAX_PARAMS} are read)",
            e.params
        ));
    }
    Ok(entries)
}

/// The common shape, read without the general parser: quoted names with
/// no escapes, each followed by `;key=integer` parameters, members split by
/// commas. Anything else (escapes, other value types, signs, decimals, odd
/// characters) returns `None` and goes to `sfv`, so both paths always agree
/// on what they accept.
fn fast_list(value: &str) -> Option<Vec<Entry<'_>>> {
    let b = value.as_bytes();
    let mut i = 0;
    let skip = |i: &mut usize, ws: &[u8]| {
        while *i < b.len() && ws.contains(&b[*i]) {
            *i += 1;
        }
    };
    skip(&mut i, b" ");
    let mut out = Vec::with_capacity(4);
    loop {
        // "name"
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let start = i + 1;
        let mut j = start;
        while j < b.len() && b[j] != b'"' {
            if b[j] == b'\\' || !(0x20..=0x7e).contains(&b[j]) {
                return None;
            }
            j += 1;
        }
        if j >= b.len() {
            return None;
        }
        let mut e = Entry {
            bare: Bare::Str(Cow::Borrowed(&value[start..j])),
            ..Entry::default()
        };
        i = j + 1;
        // ;key=integer
        while b.get(i) == Some(&b';') {
            i += 1;
            skip(&mut i, b" ");
            let ks = i;
            if !matches!(b.get(i), Some(b'a'..=b'z' | b'*')) {
                return None;
            }
            while i < b.len()
                && matches!(b[i], b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')
            {
                i += 1;
            }
            let key = &value[ks..i];
            if b.get(i) != Some(&b'=') {
                return None;
            }
            i += 1;
            let ds = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let digits = i - ds;
            if digits == 0 || digits > 15 || b.get(i) == Some(&b'.') {
                return None;
            }
            let n: i64 = value[ds..i].parse().ok()?;
            e.params += 1;
            match key {
                "q" => e.q = Num::Int(n),
                "w" => e.w = Num::Int(n),
                "r" => e.r = Num::Int(n),
                "t" => e.t = Num::Int(n),
                "qu" => return None,
                _ => {}
            }
        }
        out.push(e);
        if out.len() > MAX_MEMBERS {
            return Some(out); // too many: rejected by the caller
        }
        skip(&mut i, b" \t");
        if i == b.len() {
            return Some(out);
        }
        if b[i] != b',' {
            return None;
        }
        i += 1;
        skip(&mut i, b" \t");
        if i == b.len() {
            return None; // a trailing comma is an error: let sfv say so
        }
    }
}

/// One item of the current draft's `RateLimit-Policy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PolicyItem {
    pub(crate) name: String,
    pub(crate) q: u64,
    pub(crate) w: Option<u64>,
    pub(crate) qu: Option<String>,
}

/// One item of the current draft's `RateLimit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LimitItem {
    pub(crate) name: String,
    pub(crate) r: u64,
    pub(crate) t: Option<u64>,
}

/// What a `RateLimit-Policy` field held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PolicyField {
    /// Draft-09 onward: named policies.
    Named(Vec<PolicyItem>),
    /// Draft-05/06: quota policies `10;w=1, 50;w=60`.
    Numbered(Vec<(u64, Option<u64>)>),
}

/// What a `RateLimit` field held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LimitField {
    /// Draft-09 onward: named items.
    Named(Vec<LimitItem>),
    /// Draft-07: `limit=10, remaining=1, reset=7`.
    Draft07 {
        limit: Option<u64>,
        remaining: Option<u64>,
        reset: Option<u64>,
    },
}

fn non_neg(v: Num, what: &str) -> Result<Option<u64>, String> {
    match v {
        Num::Absent => Ok(None),
        Num::Int(i) => u64::try_from(i)
            .map(Some)
            .map_err(|_| format!("`{what}` is negative ({i})")),
        Num::NotInt => Err(format!("`{what}` is not an integer")),
    }
}

fn name_of<'a>(e: &'a Entry<'_>) -> Result<&'a str, String> {
    if e.inner_list {
        return Err("an inner list where a policy name is required".into());
    }
    match &e.bare {
        Bare::Str(s) => Ok(s),
        Bare::Token(t) => Err(format!(
            "policy name {t} is a token; the draft requires a quoted string"
        )),
        _ => Err("a policy name must be a quoted string".into()),
    }
}

/// Parses `RateLimit-Policy`.
pub(crate) fn parse_policy_field(value: &str) -> Result<PolicyField, String> {
    let entries = parse_list(value)?;
    if entries.is_empty() {
        return Err("empty list".into());
    }
    if matches!(entries[0].bare, Bare::Int(_)) && !entries[0].inner_list {
        return numbered(&entries).map(PolicyField::Numbered);
    }
    let mut out: Vec<PolicyItem> = Vec::with_capacity(entries.len());
    for e in &entries {
        let name = name_of(e)?;
        let q = non_neg(e.q, "q")?.ok_or_else(|| format!("policy {name:?} has no `q`"))?;
        let w = non_neg(e.w, "w")?;
        if w == Some(0) {
            return Err(format!("policy {name:?} has `w=0`"));
        }
        let qu = match &e.qu {
            None => None,
            Some(Ok(s)) => Some(s.to_string()),
            Some(Err(())) => return Err(format!("policy {name:?}: `qu` must be a string")),
        };
        let item = PolicyItem {
            name: name.to_string(),
            q,
            w,
            qu,
        };
        match out.iter().find(|o| o.name == item.name) {
            Some(o) if *o != item => {
                return Err(format!(
                    "policy {:?} listed twice with different values",
                    item.name
                ))
            }
            Some(_) => {}
            None => out.push(item),
        }
    }
    Ok(PolicyField::Named(out))
}

fn numbered(entries: &[Entry<'_>]) -> Result<Vec<(u64, Option<u64>)>, String> {
    entries
        .iter()
        .map(|e| {
            let q = match e.bare {
                Bare::Int(i) if !e.inner_list => {
                    u64::try_from(i).map_err(|_| format!("negative quota {i}"))?
                }
                _ => return Err("mixed quota-policy items".to_string()),
            };
            Ok((q, non_neg(e.w, "w")?))
        })
        .collect()
}

/// Parses `RateLimit`.
pub(crate) fn parse_limit_field(value: &str) -> Result<LimitField, String> {
    let entries = match parse_list(value) {
        Ok(e) => e,
        Err(list_err) => return draft07(value).ok_or(list_err),
    };
    if entries.is_empty() {
        return Err("empty list".into());
    }
    let mut out: Vec<LimitItem> = Vec::with_capacity(entries.len());
    for e in &entries {
        let name = name_of(e)?;
        let r = non_neg(e.r, "r")?.ok_or_else(|| format!("item {name:?} has no `r`"))?;
        let t = non_neg(e.t, "t")?;
        let item = LimitItem {
            name: name.to_string(),
            r,
            t,
        };
        match out.iter().find(|o| o.name == item.name) {
            Some(o) if *o != item => {
                return Err(format!(
                    "policy {:?} listed twice with different values",
                    item.name
                ))
            }
            Some(_) => {}
            None => out.push(item),
        }
    }
    Ok(LimitField::Named(out))
}

fn draft07(value: &str) -> Option<LimitField> {
    let dict: sfv::Dictionary = Parser::new(value).parse().ok()?;
    let get = |k: &str| -> Result<Option<u64>, ()> {
        match dict.get(k) {
            None => Ok(None),
            Some(sfv::ListEntry::Item(it)) => match it.bare_item.as_integer() {
                Some(i) => u64::try_from(i64::from(i)).map(Some).map_err(|_| ()),
                None => Err(()),
            },
            Some(_) => Err(()),
        }
    };
    let (limit, remaining, reset) = (
        get("limit").ok()?,
        get("remaining").ok()?,
        get("reset").ok()?,
    );
    if limit.is_none() && remaining.is_none() && reset.is_none() {
        return None;
    }
    Some(LimitField::Draft07 {
        limit,
        remaining,
        reset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_draft_fields() {
        let p = parse_policy_field(
            r#""burst";q=100;w=60;pk=:YWJj:;x=1, "daily";q=1000;w=86400;qu="requests""#,
        )
        .unwrap();
        let PolicyField::Named(p) = p else { panic!() };
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].q, p[0].w), (100, Some(60)));
        assert_eq!(p[1].qu.as_deref(), Some("requests"));
        let l = parse_limit_field(r#""default";r=50;t=30"#).unwrap();
        assert_eq!(
            l,
            LimitField::Named(vec![LimitItem {
                name: "default".into(),
                r: 50,
                t: Some(30)
            }])
        );
    }

    #[test]
    fn constraint_violations_reject_the_field() {
        for bad in [
            "burst;r=1;t=1",
            r#""a";r=-1;t=1"#,
            r#""a";r=1.5;t=1"#,
            r#""a";r=1;t=1000000000000000"#,
            r#""a";t=1"#,
            r#""a";r=1;t=2, "a";r=2;t=2"#,
            r#"("a");r=1"#,
            "",
        ] {
            assert!(parse_limit_field(bad).is_err(), "{bad}");
        }
        assert!(parse_policy_field(r#""a";w=1"#).is_err());
        assert!(parse_policy_field(r#""a";q=1;w=0"#).is_err());
        assert!(parse_policy_field(r#""a";q=1;qu=requests"#).is_err());
    }

    fn same(a: &Entry<'_>, b: &Entry<'_>) -> bool {
        let name = |e: &Entry<'_>| match &e.bare {
            Bare::Str(s) => Some(s.to_string()),
            _ => None,
        };
        name(a) == name(b)
            && a.inner_list == b.inner_list
            && (a.q, a.w, a.r, a.t) == (b.q, b.w, b.r, b.t)
            && a.qu.is_some() == b.qu.is_some()
    }

    fn by_sfv(v: &str) -> Option<Vec<Entry<'_>>> {
        Parser::new(v)
            .parse_list_with_visitor(Collect(Vec::new()))
            .ok()
    }

    proptest::proptest! {
        #[test]
        fn fast_path_agrees_with_sfv(v in r#"[ ]{0,2}("[a-z ;=,]{0,4}"(;[ ]?[a-z*][a-z0-9_.*-]{0,2}=[0-9]{1,17}(\.[0-9])?){0,4}[ \t]{0,2},?[ \t]{0,2}){1,4}[ ]{0,2}"#) {
            if let Some(fast) = fast_list(&v) {
                let slow = by_sfv(&v);
                proptest::prop_assert!(slow.is_some(), "fast accepted what sfv rejects: {v:?}");
                let slow = slow.unwrap();
                proptest::prop_assert_eq!(fast.len(), slow.len());
                for (a, b) in fast.iter().zip(&slow) {
                    proptest::prop_assert!(same(a, b), "{v:?}");
                }
            }
        }
    }

    #[test]
    fn fast_path_takes_the_common_shape() {
        assert!(fast_list(r#""burst";q=20;w=2, "daily";q=10000;w=86400"#).is_some());
        assert!(fast_list(r#""burst";r=7;t=1,"daily";r=2310;t=21600"#).is_some());
        assert!(fast_list(r#""a";q=1;qu="requests""#).is_none());
        assert!(fast_list(r#""a";r=-1"#).is_none());
        assert!(fast_list(r#""a";r=1.5"#).is_none());
        assert!(fast_list(r#""a";r=1,"#).is_none());
    }

    #[test]
    fn older_drafts() {
        assert_eq!(
            parse_policy_field("10;w=1, 50;w=60").unwrap(),
            PolicyField::Numbered(vec![(10, Some(1)), (50, Some(60))])
        );
        assert_eq!(
            parse_limit_field("limit=10, remaining=1, reset=7").unwrap(),
            LimitField::Draft07 {
                limit: Some(10),
                remaining: Some(1),
                reset: Some(7)
            }
        );
    }
}
