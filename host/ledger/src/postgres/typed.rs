//! Statements sent with their parameters' types. A statement given as text
//! and bare values is prepared first (a round trip for the server to say
//! what the parameters are), then executed (a second): each of a guarded
//! call's ~17 statements cost two. Given the types, the client sends parse,
//! bind and execute together (`query_typed`): one round trip each.

use r2d2_postgres::postgres::types::{ToSql, Type};

/// One statement parameter and its PostgreSQL type.
pub(super) type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// A Rust value whose PostgreSQL type the ledger's schema fixes.
pub(super) trait Typed: ToSql + Sync {
    /// The column type it binds to.
    const TYPE: Type;
}

impl Typed for String {
    const TYPE: Type = Type::TEXT;
}
impl Typed for &str {
    const TYPE: Type = Type::TEXT;
}
impl Typed for &String {
    const TYPE: Type = Type::TEXT;
}
impl Typed for i64 {
    const TYPE: Type = Type::INT8;
}
impl Typed for i32 {
    const TYPE: Type = Type::INT4;
}
impl Typed for bool {
    const TYPE: Type = Type::BOOL;
}
impl Typed for &[u8] {
    const TYPE: Type = Type::BYTEA;
}
impl<T: Typed> Typed for Option<T> {
    const TYPE: Type = T::TYPE;
}

/// `value` as a parameter of its type.
pub(super) fn p<T: Typed>(value: &T) -> Param<'_> {
    (value, T::TYPE)
}
