"""Typer commands generated from typed settings, so a flag is declared once, on its settings field.

Every field becomes `--field-name`, settable as `ART_PROXY_FIELD_NAME` too, with the field's
description as help and its default as default; a field marked `config.ARGUMENT` becomes a
positional argument instead. Settings validation errors become one-line messages
with exit status 2, like any other usage error.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, get_args, get_origin

import typer
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

ENV_PREFIX = "ART_PROXY_"
SettingsT = TypeVar("SettingsT", bound=BaseModel)


def settings_command(
    app: typer.Typer, name: str, model: type[SettingsT], help_text: str
) -> Callable[[Callable[[SettingsT], None]], Callable[[SettingsT], None]]:
    """Register `run(settings)` as command `name`, its options read off `model`'s fields."""

    def register(run: Callable[[SettingsT], None]) -> Callable[[SettingsT], None]:
        def command(**values: Any) -> None:
            given = {key: value for key, value in values.items() if value not in (None, [])}
            try:
                settings = model.model_validate(given)
            except ValidationError as exc:
                first = exc.errors()[0]
                flag = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else name
                # pydantic words a validator's ValueError "Value error, <ours>": ours is the message.
                message = str(first["msg"]).removeprefix("Value error, ")
                raise typer.BadParameter(message, param_hint=flag) from None
            run(settings)

        parameters = [_parameter(field_name, model) for field_name in model.model_fields]
        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]  # typer reads it
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        command.__doc__ = help_text
        app.command(name)(command)
        return run

    return register


def command_group(app: typer.Typer, name: str, help_text: str) -> typer.Typer:
    """A group of subcommands under `app` (`art-proxy NAME ...`), its help printed when it is
    given no subcommand."""
    group = typer.Typer(help=help_text, no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(group, name=name)
    return group


def _parameter(field_name: str, model: type[BaseModel]) -> inspect.Parameter:
    field = model.model_fields[field_name]
    annotation = field.annotation
    default = None if field.default is PydanticUndefined else field.default
    if get_origin(annotation) is list:
        option_type: Any = list[get_args(annotation)[0]]  # type: ignore[misc]  # built at run time
        default = None  # the settings' default_factory applies when the flag is absent
    elif type(None) in get_args(annotation):
        option_type = next(arg for arg in get_args(annotation) if arg is not type(None))
    else:
        option_type = annotation
    extra = field.json_schema_extra
    if isinstance(extra, dict) and extra.get("argument"):
        option: Any = typer.Argument(
            metavar=field_name.upper(), help=field.description, show_default=False
        )
        if field.is_required():
            default = inspect.Parameter.empty
    else:
        flag = "--" + field_name.replace("_", "-")
        if option_type is bool:  # both ways: a default of on must be switchable off
            flag = f"{flag}/--no-{flag[2:]}"
        option = typer.Option(
            flag,
            envvar=ENV_PREFIX + field_name.upper(),
            help=field.description,
            show_default=default is not None,
        )
    return inspect.Parameter(
        field_name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[option_type, option],
    )
