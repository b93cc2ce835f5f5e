//! One file, two models: a program's own top-level table, and the rest of
//! the file read by another crate's model, in a single pass.
//!
//! Why not serde's `flatten`: it buffers the values it passes on, so the
//! TOML deserializer can no longer tell where a wrong value stands, and it
//! lets fields neither model knows through. Here every key and value is
//! read straight from the deserializer: an error in either model keeps its
//! place in the text, and the rest's own model refuses what it does not
//! know (its refusal names the program's table among the fields expected).

use std::fmt;
use std::iter;
use std::marker::PhantomData;
use std::sync::OnceLock;

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, Visitor};
use serde::Deserialize;

/// The fields expected at the top of the file: the table's key, then the
/// rest's fields (filled the first time the rest names them).
pub(crate) type Expected = OnceLock<Vec<&'static str>>;

/// Reads a map whose entry `key` is a `T` and whose other entries make an
/// `R`. `expected` holds the list of fields named when `R` refuses one;
/// give each (`key`, `R`) pair its own.
pub(crate) fn split<'de, D, T, R>(
    d: D,
    key: &'static str,
    expected: &'static Expected,
) -> Result<(T, R), D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
    R: Deserialize<'de>,
{
    d.deserialize_map(Top {
        key,
        expected,
        _models: PhantomData,
    })
}

struct Top<T, R> {
    key: &'static str,
    expected: &'static Expected,
    _models: PhantomData<(T, R)>,
}

impl<'de, T: Deserialize<'de>, R: Deserialize<'de>> Visitor<'de> for Top<T, R> {
    type Value = (T, R);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a table with a `{}` table", self.key)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(T, R), A::Error> {
        let mut table = None;
        let rest = R::deserialize(Rest {
            map,
            key: self.key,
            expected: self.expected,
            table: &mut table,
        })?;
        let table = table.ok_or_else(|| de::Error::missing_field(self.key))?;
        Ok((table, rest))
    }
}

/// The map without its `key` entry, as a deserializer for the rest's model;
/// the entry's value is read into `table` on the way.
struct Rest<'a, A, T> {
    map: A,
    key: &'static str,
    expected: &'static Expected,
    table: &'a mut Option<T>,
}

impl<'de, A: MapAccess<'de>, T: Deserialize<'de>> Deserializer<'de> for Rest<'_, A, T> {
    type Error = A::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_map(RestMap {
            map: self.map,
            key: self.key,
            expected: None,
            table: self.table,
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        let key = self.key;
        let expected = self
            .expected
            .get_or_init(|| iter::once(key).chain(fields.iter().copied()).collect());
        visitor.visit_map(RestMap {
            map: self.map,
            key,
            expected: Some(expected),
            table: self.table,
        })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

struct RestMap<'a, A, T> {
    map: A,
    key: &'static str,
    expected: Option<&'static [&'static str]>,
    table: &'a mut Option<T>,
}

impl<'de, A: MapAccess<'de>, T: Deserialize<'de>> MapAccess<'de> for RestMap<'_, A, T> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let mut seed = seed;
        loop {
            let peek = Peek {
                seed,
                key: self.key,
                expected: self.expected,
            };
            match self.map.next_key_seed(peek)? {
                None => return Ok(None),
                Some(Peeked::Rest(k)) => return Ok(Some(k)),
                Some(Peeked::Table(s)) => {
                    *self.table = Some(self.map.next_value()?);
                    seed = s;
                }
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// A key as read by [`Peek`]: the program's table (handing the seed back
/// for the next key), or a key of the rest.
enum Peeked<K, V> {
    Table(K),
    Rest(V),
}

/// Reads a key: the table's own, or one the rest's seed reads.
struct Peek<K> {
    seed: K,
    key: &'static str,
    expected: Option<&'static [&'static str]>,
}

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for Peek<K> {
    type Value = Peeked<K, K::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<'de, K: DeserializeSeed<'de>> Visitor<'de> for Peek<K> {
    type Value = Peeked<K, K::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        if v == self.key {
            return Ok(Peeked::Table(self.seed));
        }
        match self.seed.deserialize(v.into_deserializer()) {
            Ok(k) => Ok(Peeked::Rest(k)),
            // a struct's field name fails only when the field is unknown
            Err(e) => Err(match self.expected {
                Some(expected) => E::unknown_field(v, expected),
                None => e,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Own {
        a: u32,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Others {
        b: u32,
        #[serde(default)]
        c: u32,
    }

    #[derive(Debug)]
    struct File(Own, Others);

    static EXPECTED: Expected = OnceLock::new();

    impl<'de> Deserialize<'de> for File {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let (own, others) = split(d, "own", &EXPECTED)?;
            Ok(File(own, others))
        }
    }

    #[test]
    fn each_model_reads_its_part() {
        let File(own, others) = toml::from_str("b = 2\n[own]\na = 1\n").unwrap();
        assert_eq!((own, others), (Own { a: 1 }, Others { b: 2, c: 0 }));
    }

    #[test]
    fn mistakes_keep_their_place() {
        let e = toml::from_str::<File>("b = 2\nd = 4\n[own]\na = 1\n").unwrap_err();
        assert_eq!(
            e.message(),
            "unknown field `d`, expected one of `own`, `b`, `c`"
        );
        assert_eq!(e.span(), Some(6..7));
        let e = toml::from_str::<File>("b = 2\n[own]\na = \"one\"\n").unwrap_err();
        assert_eq!(e.span(), Some(16..21));
        let e = toml::from_str::<File>("b = 2\n").unwrap_err();
        assert!(e.message().contains("missing field `own`"), "{e}");
        let e = toml::from_str::<File>("[own]\na = 1\n").unwrap_err();
        assert!(e.message().contains("missing field `b`"), "{e}");
    }
}
