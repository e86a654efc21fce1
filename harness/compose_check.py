"""Compose the command line's config once, before Hydra's own entry point does, so that a
mistake Hydra finds (an option a group does not have, a key the config does not have, an
override it cannot parse) is reported as one line naming the cause, like every other bad
input, instead of Hydra's multi-line report with its search path."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

# Hydra modes that do not compose the job's config (help, shell completion, info) or that
# name another config: left to Hydra as they are.
_HYDRA_ONLY_FLAGS = ("help", "hydra_help", "version", "shell_completion", "info", "config_path", "config_name",
                     "config_dir", "experimental_rerun")


def composition_error(argv: list[str], config_dir: str) -> str | None:
    """None when the command line composes; otherwise one line saying what is wrong."""
    overrides = _overrides(argv)
    if overrides is None:
        return None
    keyless = [o for o in overrides if not o.lstrip("+~").partition("=")[0].strip()]
    if keyless:
        return f"override {keyless[0]!r} names no key: write key=value (e.g. seed=5)"
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            compose(config_name="config", overrides=overrides)
    except MissingConfigException as exc:
        return _missing_option(exc)
    except ConfigCompositionException as exc:
        return _unknown_key(exc, config_dir, overrides)
    except OverrideParseException as exc:
        return f"cannot parse the overrides: {str(exc).splitlines()[0]}"
    except HydraException as exc:
        return one_line(exc)
    except ValueError as exc:  # Hydra's own checks of a value (a group given a number, say)
        return f"cannot apply the overrides: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}"
    return None


def one_line(exc: BaseException) -> str:
    """Hydra's message on one line, without its pointers to the docs and the full trace."""
    return " ".join(line.strip() for line in str(exc).splitlines()
                    if line.strip() and "hydra.cc" not in line and "HYDRA_FULL_ERROR" not in line)


def point_error(exc: BaseException) -> str:
    """One line for an override a sweep's grid point cannot take: a key its options lack
    gets no advice to add it (Hydra's `+` hint), since other points have that key."""
    if isinstance(exc.__cause__, (ConfigKeyError, ConfigAttributeError)):
        return f"{str(exc).splitlines()[0]} (this point's config has no such key)"
    return one_line(exc)


def _hydra_command_line() -> argparse.ArgumentParser:
    """The command line `@hydra.main` accepts, as its `--help` documents it: Hydra offers no
    public parser, and this one is used only to find the overrides."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("overrides", nargs="*")
    for flags in (("--help", "-h"), ("--hydra-help",), ("--version",), ("--resolve",), ("--run", "-r"),
                  ("--multirun", "-m"), ("--shell-completion", "-sc")):
        parser.add_argument(*flags, action="store_true")
    for flags in (("--package", "-p"), ("--config-path", "-cp"), ("--config-name", "-cn"), ("--config-dir", "-cd"),
                  ("--experimental-rerun",)):
        parser.add_argument(*flags)
    parser.add_argument("--cfg", "-c", choices=["job", "hydra", "all"])
    parser.add_argument("--info", "-i", const="all", nargs="?",
                        choices=["all", "config", "defaults", "defaults-tree", "plugins", "searchpath"])
    return parser


def _overrides(argv: list[str]) -> list[str] | None:
    """The overrides of a command line Hydra would compose as given; None to leave it to Hydra."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            args, unknown = _hydra_command_line().parse_known_args(argv)
        except SystemExit:
            return None
    if unknown or any(getattr(args, flag, None) for flag in _HYDRA_ONLY_FLAGS):
        return None
    return list(args.overrides)


def _missing_option(exc: MissingConfigException) -> str:
    missing = exc.missing_cfg_file or ""
    group, _, option = missing.rpartition("/")
    if not group or exc.options is None:
        return str(exc).splitlines()[0]
    close = difflib.get_close_matches(option, exc.options, n=1)
    hint = f"; did you mean {group}={close[0]}?" if close else ""
    return f"configs/{group}/ has no option '{option}' (options: {', '.join(exc.options)}){hint}"


def _unknown_key(exc: ConfigCompositionException, config_dir: str, overrides: list[str]) -> str:
    cause = exc.__cause__
    full_key = getattr(cause, "full_key", None)
    if not isinstance(cause, (ConfigKeyError, ConfigAttributeError)) or not full_key:
        return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    parent, _, key = str(full_key).rpartition(".")
    # the keys as the rest of the command line composes them (a sweep adds `sweep`)
    others = [o for o in overrides if not o.lstrip("+~").partition("=")[0].startswith(str(full_key))]
    known = _keys_under(parent, config_dir, others)
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        hint = f"did you mean {'.'.join(filter(None, [parent, close[0]]))}?"
    else:
        hint = f"the keys{' under ' + parent if parent else ''} are {', '.join(known) or 'none'}"
    return f"unknown config key '{full_key}': {hint} (a new key needs a leading +)"


def _keys_under(parent: str, config_dir: str, overrides: list[str]) -> list[str]:
    base: Any = None
    others = list(overrides)
    while base is None:
        try:
            with initialize_config_dir(config_dir=config_dir, version_base=None):
                base = compose(config_name="config", overrides=others)
        except ConfigCompositionException as exc:
            # another bad key on the same command line: leave it out to list the real keys
            bad = str(getattr(exc.__cause__, "full_key", "") or "")
            kept = [o for o in others if not bad or not o.lstrip("+~").partition("=")[0].startswith(bad)]
            if len(kept) == len(others):
                return []
            others = kept
        except (HydraException, ValueError):
            return []
    node = OmegaConf.select(base, parent) if parent else base
    return sorted(str(k) for k in node.keys()) if OmegaConf.is_dict(node) else []
