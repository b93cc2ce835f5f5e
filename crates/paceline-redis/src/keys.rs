//! Key names: `<prefix>:{<tag>}:<plan>`, where the tag is a keyed hash of
//! the client's key (never the key itself) and the plan part is the plan's
//! identity. The braces make the tag Redis Cluster's hash tag, so every
//! row of one client lands in one slot.

use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher13};

use paceline_core::Plan;

/// Hashes client keys with a secret.
#[derive(Clone)]
pub(crate) struct KeyNamer {
    k0: u64,
    k1: u64,
    prefix: String,
}

impl KeyNamer {
    /// A namer keyed by `secret` (any length; it is compressed to the
    /// 128-bit SipHash key).
    pub(crate) fn new(secret: &[u8], prefix: &str) -> KeyNamer {
        let mut h = SipHasher13::new_with_keys(0x7061_6365_6c69_6e65, 0x7265_6469_735f_7631);
        h.write(secret);
        let k = h.finish128();
        KeyNamer {
            k0: k.h1,
            k1: k.h2,
            prefix: prefix.to_string(),
        }
    }

    /// What every name starts with.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The keyed hash of a client key.
    pub(crate) fn hash(&self, key: &str) -> u128 {
        let mut h = SipHasher13::new_with_keys(self.k0, self.k1);
        h.write(key.as_bytes());
        h.finish128().as_u128()
    }

    /// The name of an idempotency entry (by its entry key's hex): the
    /// keyed hash is its own hash tag, so each entry has its slot.
    pub(crate) fn idempotency_name(&self, entry: &str) -> String {
        format!("{}:idem:{{{:032x}}}", self.prefix, self.hash(entry))
    }

    /// The hash tag of a client key: 32 hex digits.
    #[cfg(test)]
    pub(crate) fn tag(&self, key: &str) -> String {
        format!("{:032x}", self.hash(key))
    }

    /// The row of a client key (by its hash) under `plan`, and its
    /// cluster slot: one string, written without formatting machinery
    /// (it is made once per decision).
    pub(crate) fn row_of(&self, plan: &Plan, hash: u128) -> (String, u16) {
        let mut row = String::with_capacity(self.prefix.len() + 2 + 32 + 2 + 16);
        row.push_str(&self.prefix);
        row.push_str(":{");
        let start = row.len();
        push_hex(&mut row, hash, 32);
        let slot = slot(&row.as_bytes()[start..]);
        row.push_str("}:");
        push_hex(&mut row, u128::from(plan.identity()), 16);
        (row, slot)
    }
}

/// Appends the low `digits` hex digits of `v`, most significant first.
fn push_hex(s: &mut String, v: u128, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for i in (0..digits).rev() {
        s.push(char::from(HEX[((v >> (4 * i)) & 0xf) as usize]));
    }
}

/// CRC16/XMODEM, a byte at a time.
const CRC16: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// The Redis Cluster slot of a hash tag's content (CRC16/XMODEM mod 16384).
pub(crate) fn slot(tag: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in tag {
        crc = (crc << 8) ^ CRC16[usize::from((crc >> 8) as u8 ^ b)];
    }
    crc & 0x3fff
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::Policy;

    impl KeyNamer {
        fn row(&self, plan: &Plan, key: &str) -> (String, u16) {
            self.row_of(plan, self.hash(key))
        }
    }

    #[test]
    fn slots_match_redis() {
        // the reference values of the cluster specification
        assert_eq!(slot(b"123456789"), 0x31c3 & 0x3fff);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
    }

    #[test]
    fn names_hide_the_key_and_depend_on_the_secret() {
        let plan = Plan::new("p", vec![Policy::token_bucket("b", 2, 1).unwrap()]).unwrap();
        let a = KeyNamer::new(b"one", "pl");
        let b = KeyNamer::new(b"two", "pl");
        let (name, slot_a) = a.row(&plan, "k:sk_live_secret");
        assert!(!name.contains("sk_live"), "{name}");
        assert!(name.starts_with("pl:{"), "{name}");
        assert_ne!(name, b.row(&plan, "k:sk_live_secret").0);
        assert_eq!(slot_a, slot(a.tag("k:sk_live_secret").as_bytes()));
        assert_eq!(a.row(&plan, "k:x"), a.row(&plan, "k:x"));
        // the name as the format it replaced wrote it
        let h = a.hash("k:x");
        assert_eq!(
            a.row(&plan, "k:x").0,
            format!("pl:{{{h:032x}}}:{:016x}", plan.identity())
        );
    }
}
