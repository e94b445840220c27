//! [`config_section!`](crate::config_section): a section of keys declared once.

/// Declares a section of keys once: each key's name, type, default, range and meaning
/// are one entry, `field: type = default, range, "meaning";`, from which the macro
/// writes the serde struct (every field defaulted; unknown fields refused), its
/// defaults, and a `&[KeyDoc]` constant (name = prefix + field, in the order written)
/// for the key table ([`keys::Section`](crate::config::keys::Section)). Each field's doc
/// is its meaning.
///
/// ```ignore
/// weir_service::config_section! {
///     /// `[session]`.
///     #[derive(Debug, PartialEq)]
///     pub(super) struct RawSession, SESSION = "session.";
///     {
///         pending_cap: u64 = 5, Range::int(0, 1000000), "most requests per session";
///     }
/// }
/// ```
///
/// The struct derives `Clone`, `Serialize` and `Deserialize` (add `Debug`, `PartialEq`
/// by attribute: a section with secrets writes its own `Debug`). Its fields have the
/// struct's visibility. Variants:
/// - `struct Name: flattened, ...`: no `deny_unknown_fields`, for a struct flattened
///   into another (serde cannot refuse unknown fields there; the loader does, from the
///   schema);
/// - `DOCS = "prefix.", DOCS2 = "prefix2."`: the same keys documented again
///   under another prefix (a sub-table that is also an element's: `backend.sim.` and
///   `backends[].sim.`);
/// - `fn name(arg: Type);` (with its doc) before the keys: the defaults are the
///   constructor `name`, whose arguments the default expressions may use (a
///   per-binary default), instead of `Default`;
/// - `nested { field: Type, #[serde(flatten)] other: Type = expr }` after the keys:
///   fields that are sections, not keys (their own keys documented by their own
///   declaration), defaulted by `Default::default()` or `expr`.
#[macro_export]
macro_rules! config_section {
    (
        $(#[$meta:meta])* $vis:vis struct $name:ident: flattened, $($rest:tt)*
    ) => {
        $crate::config_section!(@serde [default] $(#[$meta])* $vis $name, $($rest)*);
    };
    (
        $(#[$meta:meta])* $vis:vis struct $name:ident, $($rest:tt)*
    ) => {
        $crate::config_section!(
            @serde [deny_unknown_fields, default] $(#[$meta])* $vis $name, $($rest)*
        );
    };
    // Defaults by a constructor, or by `Default`.
    (
        @serde $serde:tt $(#[$meta:meta])* $vis:vis $name:ident,
        $($docs:ident = $prefix:literal),+;
        $(#[$cmeta:meta])* $cvis:vis fn $ctor:ident($($arg:ident: $arg_ty:ty),* $(,)?);
        $($rest:tt)*
    ) => {
        $crate::config_section!(
            @impl $serde $(#[$meta])* $vis $name, [$($docs = $prefix),+];
            [impl $name] [$(#[$cmeta])* $cvis fn $ctor($($arg: $arg_ty),*) -> Self]
            $($rest)*
        );
    };
    (
        @serde $serde:tt $(#[$meta:meta])* $vis:vis $name:ident,
        $($docs:ident = $prefix:literal),+; $($rest:tt)*
    ) => {
        $crate::config_section!(
            @impl $serde $(#[$meta])* $vis $name, [$($docs = $prefix),+];
            [impl Default for $name] [fn default() -> Self]
            $($rest)*
        );
    };
    (
        @impl [$($serde:tt)*] $(#[$meta:meta])* $vis:vis $name:ident, $docs:tt;
        [$($impl:tt)*] [$($ctor:tt)*]
        { $($field:ident: $ty:ty = $default:expr, $range:expr, $help:literal;)* }
        $(nested { $($(#[$smeta:meta])* $sub:ident: $sub_ty:ty $(= $sub_default:expr)?),* $(,)? })?
    ) => {
        $(#[$meta])*
        #[derive(Clone, serde::Serialize, serde::Deserialize)]
        #[serde($($serde)*)]
        $vis struct $name {
            $(#[doc = $help] $vis $field: $ty,)*
            $($($(#[$smeta])* $vis $sub: $sub_ty,)*)?
        }

        $($impl)* {
            $($ctor)* {
                Self {
                    $($field: $default,)*
                    $($($sub: $crate::config_section!(@or_default $($sub_default)?),)*)?
                }
            }
        }

        $crate::config_section!(@docs $vis $name, $docs, { $($field, $range, $help;)* });
    };
    // One `&[KeyDoc]` constant per `DOCS = "prefix."`.
    (@docs $vis:vis $name:ident, [], $keys:tt) => {};
    (
        @docs $vis:vis $name:ident, [$docs:ident = $prefix:literal $(, $more:ident = $more_prefix:literal)*],
        { $($field:ident, $range:expr, $help:literal;)* }
    ) => {
        #[doc = concat!("Range and meaning of every key of [`", stringify!($name), "`].")]
        $vis const $docs: &[$crate::config::keys::KeyDoc] = &[$(
            $crate::config::keys::KeyDoc::new(concat!($prefix, stringify!($field)), $range, $help),
        )*];
        $crate::config_section!(
            @docs $vis $name, [$($more = $more_prefix),*], { $($field, $range, $help;)* }
        );
    };
    (@or_default) => { Default::default() };
    (@or_default $default:expr) => { $default };
}
