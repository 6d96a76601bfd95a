//! The templates of the rendered files: embedded in the binary, overridable by name from a
//! directory (`--templates DIR`).
//!
//! Templates are minijinja with strict undefined values (a misspelt variable is an error
//! naming the file and line, never an empty string), no auto-escaping, `trim_blocks` and
//! `lstrip_blocks`. Every value a template receives that ends up in a shell script is
//! already a quoted shell word (see [`super::shell`]), so a template decides the layout of
//! a file, never how the shell reads a value.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value};

use super::RenderError;

/// One launch script per node.
pub const LAUNCH: &str = "launch.sh.j2";
/// The Megatron arguments, one shell-quoted word per line.
pub const MEGATRON_ARGS: &str = "megatron-args.txt.j2";
/// The DeepSpeed hostfile (DeepSpeed-based scripts only).
pub const HOSTFILE: &str = "hostfile.j2";
/// The DeepSpeed configuration (DeepSpeed-based scripts only).
pub const DS_CONFIG: &str = "ds_config.json.j2";
/// The run directory's summary.
pub const README: &str = "README.md.j2";

const EMBEDDED: &[(&str, &str)] = &[
    (LAUNCH, include_str!("../../templates/launch.sh.j2")),
    (
        MEGATRON_ARGS,
        include_str!("../../templates/megatron-args.txt.j2"),
    ),
    (HOSTFILE, include_str!("../../templates/hostfile.j2")),
    (DS_CONFIG, include_str!("../../templates/ds_config.json.j2")),
    (README, include_str!("../../templates/README.md.j2")),
];

/// The names of every template, as files in a `--templates` directory are named.
pub fn names() -> Vec<&'static str> {
    EMBEDDED.iter().map(|(name, _)| *name).collect()
}

/// The set of templates a render uses.
#[derive(Debug, Clone)]
pub struct Templates {
    env: Environment<'static>,
    /// Where each template came from: `None` embedded, else the file.
    origin: BTreeMap<&'static str, Option<PathBuf>>,
}

impl Templates {
    /// The templates shipped in the binary.
    pub fn embedded() -> Self {
        let mut templates = Templates {
            env: environment(),
            origin: BTreeMap::new(),
        };
        for (name, source) in EMBEDDED {
            templates
                .add(name, source.to_string(), None)
                .unwrap_or_else(|e| panic!("embedded template is broken (a bug): {e}"));
        }
        templates
    }

    /// The embedded templates, with those that `dir` holds a file of the same name for
    /// (see [`names`]) replaced by that file. Other files in `dir` are left alone (the
    /// directory may hold templates of other stages). Each file is parsed here, so a syntax
    /// error is reported with its file and line before anything runs.
    pub fn from_dir(dir: &Path) -> Result<Self, RenderError> {
        if !dir.is_dir() {
            return Err(RenderError::TemplateDir {
                path: dir.display().to_string(),
                message: "not a directory".into(),
            });
        }
        let mut templates = Templates::embedded();
        for (name, _) in EMBEDDED {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            let source =
                crate::input_file::read_to_string(&path).map_err(|e| RenderError::TemplateDir {
                    path: path.display().to_string(),
                    message: e.to_string(),
                })?;
            templates.add(name, source, Some(path))?;
        }
        Ok(templates)
    }

    /// Where the template `name` comes from: `embedded` or its file.
    pub fn origin(&self, name: &str) -> String {
        match self.origin.get(name) {
            Some(Some(path)) => path.display().to_string(),
            _ => "embedded".to_string(),
        }
    }

    fn add(
        &mut self,
        name: &'static str,
        source: String,
        path: Option<PathBuf>,
    ) -> Result<(), RenderError> {
        self.origin.insert(name, path);
        let error = self.env.add_template_owned(name, source).err();
        match error {
            Some(e) => Err(self.error(name, &e)),
            None => Ok(()),
        }
    }

    /// Renders the template `name` with `context`.
    pub(crate) fn render(&self, name: &str, context: Value) -> Result<String, RenderError> {
        let template = self
            .env
            .get_template(name)
            .map_err(|e| self.error(name, &e))?;
        template.render(context).map_err(|e| self.error(name, &e))
    }

    fn error(&self, name: &str, error: &minijinja::Error) -> RenderError {
        let mut message = error.kind().to_string();
        if let Some(detail) = error.detail() {
            message = format!("{message}: {detail}");
        }
        RenderError::Template {
            template: match self.origin.get(name) {
                Some(Some(path)) => path.display().to_string(),
                _ => format!("{name} (embedded)"),
            },
            line: error.line(),
            message,
        }
    }
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(true)
        .build()
        .unwrap_or_default();
    env.set_syntax(syntax);
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::context;

    #[test]
    fn embedded_templates_parse() {
        let t = Templates::embedded();
        for name in names() {
            assert_eq!(t.origin(name), "embedded");
        }
    }

    #[test]
    fn undefined_values_are_errors_with_the_line() {
        let t = Templates::embedded();
        let err = t.render(HOSTFILE, context! {}).unwrap_err();
        match &err {
            RenderError::Template { template, line, .. } => {
                assert!(template.contains(HOSTFILE), "{err}");
                assert!(line.is_some(), "{err}");
            }
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("undefined"), "{err}");
    }

    #[test]
    fn a_directory_overrides_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(HOSTFILE),
            "{% for n in nodes %}{{ n.host }}\n{% endfor %}",
        )
        .unwrap();
        std::fs::write(dir.path().join("unrelated.py.j2"), "{{ ").unwrap();
        let t = Templates::from_dir(dir.path()).unwrap();
        assert_eq!(
            t.origin(HOSTFILE),
            dir.path().join(HOSTFILE).display().to_string()
        );
        assert_eq!(t.origin(LAUNCH), "embedded");
        let nodes = vec![
            context! { host => "a", slots => 8 },
            context! { host => "b", slots => 8 },
        ];
        assert_eq!(t.render(HOSTFILE, context! { nodes }).unwrap(), "a\nb\n");
    }

    #[test]
    fn syntax_errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LAUNCH), "#!/bin/bash\n\n{% for x in %}\n").unwrap();
        let err = Templates::from_dir(dir.path()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&dir.path().join(LAUNCH).display().to_string()),
            "{text}"
        );
        assert!(text.contains("line 3"), "{text}");
        let missing = Templates::from_dir(&dir.path().join("nope")).unwrap_err();
        assert!(missing.to_string().contains("nope"), "{missing}");
    }
}
