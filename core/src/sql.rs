//! How the core's enums are stored in PostgreSQL, compiled only with the `sqlx` feature (the
//! adapters enable it; the core itself never talks to a database). `ExecutionStatus` is the
//! `execution_status` enum by derive; a `FailureKind` is stored as its snake_case text, which
//! the `execution_failure_kind_known` foreign key limits to the rows of `failure_kind`.
#![cfg(feature = "sqlx")]

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::{Decode, Encode, Postgres, Type};

use crate::FailureKind;

impl Type<Postgres> for FailureKind {
    fn type_info() -> PgTypeInfo {
        <&str as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <&str as Type<Postgres>>::compatible(ty)
    }
}

impl Encode<'_, Postgres> for FailureKind {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <&str as Encode<Postgres>>::encode(self.as_str(), buf)
    }
}

impl<'r> Decode<'r, Postgres> for FailureKind {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        let text = <&str as Decode<Postgres>>::decode(value)?;
        FailureKind::parse(text).ok_or_else(|| format!("unknown failure kind {text:?}").into())
    }
}
