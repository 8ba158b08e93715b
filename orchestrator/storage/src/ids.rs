//! The database's keys as types: a trial's `trial_id` (across all studies)
//! and `number` (its place in its study, 0, 1, 2, ...), a study's
//! `study_id` and a run's `run_id`. All are `INTEGER`s; their types keep
//! them apart.

use std::fmt;

use serde::{Deserialize, Serialize};
use sqlx::database::Database;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::{Decode, Encode, Type};

macro_rules! stored_integer {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub i64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl<DB: Database> Type<DB> for $name
        where
            i64: Type<DB>,
        {
            fn type_info() -> DB::TypeInfo {
                <i64 as Type<DB>>::type_info()
            }
            fn compatible(ty: &DB::TypeInfo) -> bool {
                <i64 as Type<DB>>::compatible(ty)
            }
        }

        impl<'q, DB: Database> Encode<'q, DB> for $name
        where
            i64: Encode<'q, DB>,
        {
            fn encode_by_ref(
                &self,
                buf: &mut <DB as Database>::ArgumentBuffer<'q>,
            ) -> Result<IsNull, BoxDynError> {
                self.0.encode_by_ref(buf)
            }
        }

        impl<'r, DB: Database> Decode<'r, DB> for $name
        where
            i64: Decode<'r, DB>,
        {
            fn decode(value: <DB as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
                i64::decode(value).map($name)
            }
        }
    };
}

stored_integer!(
    /// `trials.trial_id`: a trial's key in the database.
    TrialId
);
stored_integer!(
    /// `studies.study_id`: a study's key in the database.
    StudyId
);
stored_integer!(
    /// `salus_runs.run_id`: one process's turn at a study.
    RunId
);

/// `trials.number`, which the samplers and pruners also key by.
pub use tuning::TrialNumber;
