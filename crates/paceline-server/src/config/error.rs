//! Configuration errors, typed by what went wrong.
//!
//! A caller that wants to react to a kind of mistake (a gateway telling a
//! missing plan from a malformed file) reads [`ConfigError::kind`]; the
//! message is for people and may change wording at any time.

use std::fmt;

/// What kind of mistake a configuration holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// A key, route or default names a plan that is not defined.
    UnknownPlan,
    /// A policy that cannot be enforced: an unknown algorithm, unit, kind
    /// or fail mode, a zero quota or window, a window where none belongs.
    InvalidPolicy,
    /// Something given twice where once is the most (a plan, a policy name
    /// within a plan, a key in two files).
    Duplicate,
    /// A number outside the range it must lie in.
    OutOfRange,
    /// A value of the right type but not of the form the field takes (an
    /// address, a URI, a path, a header name, a network).
    InvalidValue,
    /// Something another setting needs is not given (the plan of an
    /// anonymous route, the `[gateway]` table).
    Missing,
    /// A field the model does not have.
    UnknownField,
    /// A value that does not fit the model: a wrong type, or a table
    /// without a field it must have.
    Mismatch,
    /// The text does not parse.
    Syntax,
    /// A file could not be read.
    Unreadable,
}

/// A configuration mistake: its kind, the field at fault and what is wrong
/// with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    kind: ConfigErrorKind,
    field: String,
    message: String,
}

impl ConfigError {
    pub(crate) fn new(
        kind: ConfigErrorKind,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            kind,
            field: field.into(),
            message: message.into(),
        }
    }
    /// What kind of mistake it is.
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }
    /// The field at fault, as a path (`plans.free.policies[1].w`).
    pub fn field(&self) -> &str {
        &self.field
    }
    /// What is wrong and how to fix it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}
