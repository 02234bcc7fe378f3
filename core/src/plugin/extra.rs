//! The policy kinds that are no [`PolicyKind`] (that enum crosses the boundary and cannot grow
//! within policy-api 0.5): admission (0.5.2) and scaler (0.5.4). Each has its own listing in a
//! library's root module, read as empty from a library built before the kind existed; one code
//! path lists, settles and makes both.

use std::fmt;
use std::path::Path;

use abi_stable::std_types::RStr;
use routelab_policy_api::{AdmissionBox, AdmissionContext, Maker, ScalerBox, ScalerContext};

use super::{LoadError, LoadErrorKind, Loader, PolicySpec, Source, policy_error};

/// A policy kind outside [`PolicyKind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtraKind {
    Admission,
    Scaler,
}

impl ExtraKind {
    fn name(self) -> &'static str {
        match self {
            ExtraKind::Admission => "admission policy",
            ExtraKind::Scaler => "scaler",
        }
    }
    /// The policy-api patch that added the kind.
    fn since(self) -> &'static str {
        match self {
            ExtraKind::Admission => "0.5.2",
            ExtraKind::Scaler => "0.5.4",
        }
    }
    fn makes(self, m: &Maker) -> bool {
        matches!((self, m), (ExtraKind::Admission, Maker::Admission(_)) | (ExtraKind::Scaler, Maker::Scaler(_)))
    }
}

impl Loader {
    /// The policies of `kind` the built-ins (`None`) or a library offer: name, description,
    /// default config. A library built before the kind existed offers none.
    pub fn extra_list(
        &mut self,
        kind: ExtraKind,
        library: Option<&Path>,
    ) -> Result<Vec<(String, String, String)>, LoadError> {
        let Some(p) = library else {
            return Ok(self
                .builtins
                .iter()
                .filter(|e| kind.makes(&e.make))
                .map(|e| {
                    (e.name.to_string(), e.description.to_string(), e.default_config_checked().unwrap_or_default())
                })
                .collect());
        };
        let lib = self.library(p)?;
        let label = p.display().to_string();
        // The two listings have their own info types with the same three fields.
        macro_rules! rows {
            ($listing:expr) => {{
                let Some(f) = $listing else { return Ok(Vec::new()) };
                let infos = f().into_result().map_err(|e| policy_error(&label, e))?;
                Ok(infos
                    .into_iter()
                    .map(|i| {
                        let config = i.default_config.into_result().map(String::from).unwrap_or_default();
                        (i.name.into(), i.description.into(), config)
                    })
                    .collect())
            }};
        }
        match kind {
            ExtraKind::Admission => rows!(lib.admission_policies()),
            ExtraKind::Scaler => rows!(lib.scaler_policies()),
        }
    }

    /// The admission policies on offer (see [`Loader::extra_list`]).
    pub fn admission_list(&mut self, library: Option<&Path>) -> Result<Vec<(String, String, String)>, LoadError> {
        self.extra_list(ExtraKind::Admission, library)
    }

    /// Settles the policy of `kind` that `spec` names (built in or from a library): the result
    /// makes instances without the loader.
    pub fn extra_factory(&mut self, kind: ExtraKind, spec: &PolicySpec) -> Result<ExtraFactory, LoadError> {
        let offered = self.extra_list(kind, spec.library.as_deref())?;
        let names: Vec<&str> = offered.iter().map(|o| o.0.as_str()).collect();
        let where_ = match &spec.library {
            Some(p) => format!("library {}", p.display()),
            None => "the built-ins".to_string(),
        };
        let name = match &spec.name {
            Some(n) if names.contains(&n.as_str()) => n.clone(),
            None if names.len() == 1 => names[0].to_string(),
            other => {
                let what = other.as_ref().map_or("an unnamed".to_string(), |n| format!("'{n}', no"));
                return Err(LoadError::new(
                    LoadErrorKind::UnknownPolicy,
                    format!(
                        "{what} {} in {where_}{}",
                        kind.name(),
                        other
                            .as_ref()
                            .map_or(String::new(), |n| crate::suggest::did_you_mean(n, names.iter().copied()))
                    ),
                    if names.is_empty() {
                        format!(
                            "this library exports no {} (built against policy-api before {}?)",
                            kind.name(),
                            kind.since()
                        )
                    } else {
                        format!("use one of: {}", names.join(", "))
                    },
                ));
            }
        };
        let source = match &spec.library {
            None => {
                let e = self.builtins.iter().find(|e| e.name == name && kind.makes(&e.make)).expect("listed");
                Source::Builtin(e.make)
            }
            Some(p) => Source::Library(self.library(p)?, name),
        };
        Ok(ExtraFactory { spec: spec.clone(), kind, source })
    }

    /// Settles an admission policy (see [`Loader::extra_factory`]).
    pub fn admission_factory(&mut self, spec: &PolicySpec) -> Result<AdmissionFactory, LoadError> {
        self.extra_factory(ExtraKind::Admission, spec)
    }

    /// Settles a scaler (see [`Loader::extra_factory`]).
    pub fn scaler_factory(&mut self, spec: &PolicySpec) -> Result<ScalerFactory, LoadError> {
        self.extra_factory(ExtraKind::Scaler, spec)
    }
}

/// A policy of a kind outside [`PolicyKind`] whose name and source are settled.
#[derive(Clone)]
pub struct ExtraFactory {
    pub spec: PolicySpec,
    kind: ExtraKind,
    source: Source,
}

/// An admission policy whose name and source are settled.
pub type AdmissionFactory = ExtraFactory;
/// A scaler whose name and source are settled.
pub type ScalerFactory = ExtraFactory;

impl fmt::Debug for ExtraFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtraFactory({:?}, {:?})", self.spec.label, self.kind)
    }
}

impl ExtraFactory {
    fn predates(&self) -> LoadError {
        LoadError::new(
            LoadErrorKind::UnknownPolicy,
            format!("policy '{}': its library predates {}s", self.spec.label, self.kind.name()),
            format!("rebuild it against routelab-policy-api {} or later", self.kind.since()),
        )
    }

    /// A fresh admission policy for `ctx`; its request facts are checked here, before any run.
    pub fn admission(&self, ctx: &AdmissionContext) -> Result<AdmissionBox, LoadError> {
        let made = match &self.source {
            Source::Builtin(Maker::Admission(make)) => make(&self.spec.config, ctx),
            Source::Library(lib, name) if self.kind == ExtraKind::Admission => match lib.new_admission() {
                Some(f) => f(RStr::from_str(name), RStr::from_str(&self.spec.config), ctx).into_result(),
                None => return Err(self.predates()),
            },
            _ => unreachable!("an admission factory holds an admission maker"),
        };
        let a = made.map_err(|e| policy_error(&self.spec.label, e))?;
        let names = a.request_facts().into_result().map_err(|e| policy_error(&self.spec.label, e))?;
        crate::facts::RequestFacts::negotiate(&names, ctx.world).map_err(|e| {
            LoadError::new(
                LoadErrorKind::BadConfig,
                format!("policy '{}' {e}", self.spec.label),
                "ask only for the request facts this world provides (routelab_policy_api::facts::request)",
            )
        })?;
        Ok(a)
    }

    /// A fresh scaler for `ctx`.
    pub fn scaler(&self, ctx: &ScalerContext) -> Result<ScalerBox, LoadError> {
        let made = match &self.source {
            Source::Builtin(Maker::Scaler(make)) => make(&self.spec.config, ctx),
            Source::Library(lib, name) if self.kind == ExtraKind::Scaler => match lib.new_scaler() {
                Some(f) => f(RStr::from_str(name), RStr::from_str(&self.spec.config), ctx).into_result(),
                None => return Err(self.predates()),
            },
            _ => unreachable!("a scaler factory holds a scaler maker"),
        };
        made.map_err(|e| policy_error(&self.spec.label, e))
    }
}
