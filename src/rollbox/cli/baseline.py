"""``rollbox baseline …``: build, import, export and manage baselines."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from rollbox.baselines.store import BaselineStore
from rollbox.cli.output import JSON_OPTION, console, emit
from rollbox.config import Home
from rollbox.errors import CorruptionError, InvalidInputError, RecipeError
from rollbox.models import BaselineInfo

app = typer.Typer(
    help="Baselines: immutable OCI images that sandboxes start from.",
    no_args_is_help=True,
)


def _store() -> BaselineStore:
    return BaselineStore(Home.from_env().ensure())


def _names(names: list[str] | None) -> list[str]:
    from rollbox.baselines.refs import check_name

    return [check_name(n) for n in names or []]


def _summary(info: BaselineInfo) -> str:
    names = f"  ({', '.join(info.names)})" if info.names else ""
    return f"{info.digest}{names}"


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _kv(pairs: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in pairs or []:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise InvalidInputError(f"{what} {p!r} is not KEY=VALUE")
        out[k] = v
    return out


@app.command("default")
def default_cmd(json_: bool = JSON_OPTION) -> None:
    """Print the default baseline's digest (Debian bookworm + python3), bootstrapping it on
    first use."""
    info = _store().default()
    emit(info, json_, info.digest)


@app.command("bootstrap")
def bootstrap_cmd(
    recipe_file: Path | None = typer.Argument(None, help="Recipe file (.json or .toml)."),
    suite: str | None = typer.Option(None, help="Debian suite (default bookworm)."),
    variant: str | None = typer.Option(None, help="mmdebstrap variant (default minbase)."),
    package: list[str] | None = typer.Option(None, "--package", "-p", help="Package to add."),
    file: list[str] | None = typer.Option(
        None, "--file", help="DEST=HOSTFILE: copy a host file into the image."
    ),
    command: list[str] | None = typer.Option(
        None, "--command", "-c", help="Shell command run in the image after packages."
    ),
    mirror: str | None = typer.Option(None, help="Debian mirror URL."),
    name: list[str] | None = typer.Option(None, "--name", "-t", help="Name to give it."),
    json_: bool = JSON_OPTION,
) -> None:
    """Bootstrap a Debian baseline from a recipe with mmdebstrap (cached by recipe hash)."""
    from rollbox.baselines.builders.bootstrap import bootstrap
    from rollbox.baselines.recipe import load_recipe, recipe_from_data

    data: dict[str, object] = {}
    if recipe_file is not None:
        data = load_recipe(recipe_file).model_dump()
    for key, value in (("suite", suite), ("variant", variant), ("mirror", mirror)):
        if value is not None:
            data[key] = value
    if package:
        data["packages"] = [*list(data.get("packages") or []), *package]  # type: ignore[call-overload]
    if command:
        data["commands"] = [*list(data.get("commands") or []), *command]  # type: ignore[call-overload]
    if file:
        files = dict(data.get("files") or {})  # type: ignore[call-overload]
        for dest, src in _kv(file, "--file").items():
            try:
                files[dest] = Path(src).read_text()
            except (OSError, UnicodeDecodeError):
                raise RecipeError(f"--file {dest}={src}: cannot read {src} as text")
        data["files"] = files
    recipe = recipe_from_data(data, str(recipe_file) if recipe_file else "recipe")
    info = bootstrap(_store(), recipe, names=_names(name))
    emit(info, json_, info.digest)


@app.command("build")
def build_cmd(
    context: Path = typer.Argument(..., help="Build context directory."),
    file: Path | None = typer.Option(
        None, "--file", "-f", help="Dockerfile (default: DIR/Dockerfile)."
    ),
    build_arg: list[str] | None = typer.Option(None, "--build-arg", help="K=V build argument."),
    name: list[str] | None = typer.Option(None, "--name", "-t", help="Name to give it."),
    json_: bool = JSON_OPTION,
) -> None:
    """Build a Dockerfile with buildah; FROM resolves to store baselines by name."""
    from rollbox.baselines.builders.buildah import build

    info = build(
        _store(),
        context,
        dockerfile=file,
        build_args=_kv(build_arg, "--build-arg"),
        names=_names(name),
    )
    emit(info, json_, info.digest)


@app.command("import")
def import_cmd(
    ref: str = typer.Argument(
        ...,
        help="docker://…, oci:DIR[:TAG], oci-archive:FILE, docker-archive:FILE, or a "
        "rootfs directory / tarball.",
    ),
    name: list[str] | None = typer.Option(None, "--name", "-t", help="Name to give it."),
    tls_verify: bool | None = typer.Option(
        None, "--tls-verify/--no-tls-verify", help="Registry TLS (default: off for loopback)."
    ),
    json_: bool = JSON_OPTION,
) -> None:
    """Import an image (digest preserved) or a rootfs directory/tarball."""
    from rollbox.baselines.builders.skopeo import import_image, is_transport_ref

    store = _store()
    names = _names(name)
    if is_transport_ref(ref):
        info = import_image(store, ref, names=names, tls_verify=tls_verify)
    else:
        info = store.import_rootfs(Path(ref), names=names)
    emit(info, json_, info.digest)


@app.command("export")
def export_cmd(
    ref: str = typer.Argument(..., help="Digest, prefix or name."),
    dest: str = typer.Argument(..., help="oci-archive:FILE, oci:DIR:TAG or docker://…"),
    tls_verify: bool | None = typer.Option(
        None, "--tls-verify/--no-tls-verify", help="Registry TLS (default: off for loopback)."
    ),
    json_: bool = JSON_OPTION,
) -> None:
    """Export a baseline; importing the result gives back the same digest."""
    from rollbox.baselines.builders.skopeo import export_image

    digest = export_image(_store(), ref, dest, tls_verify=tls_verify)
    emit({"digest": digest, "dest": dest}, json_, f"{digest} -> {dest}")


@app.command("ls")
def ls_cmd(json_: bool = JSON_OPTION) -> None:
    """List baselines."""
    infos = _store().all()

    def human() -> None:
        if not infos:
            console.print("no baselines (try `rollbox baseline default`)")
        for i in infos:
            names = ", ".join(i.names)
            console.print(
                f"{i.digest[7:19]}  {i.source.type:<10} {len(i.layers):>2} layers "
                f"{_size(i.size):>9}  {i.created_at:%Y-%m-%d %H:%M}  {names}"
            )

    emit(infos, json_, human)


@app.command("show")
def show_cmd(
    ref: str = typer.Argument(..., help="Digest, prefix or name."), json_: bool = JSON_OPTION
) -> None:
    """Show a baseline with its lineage (parents, as far as the store knows)."""
    store = _store()
    chain = store.lineage(ref)
    info = chain[0]
    users = store.in_use(info.digest)
    doc = {**info.model_dump(mode="json"), "lineage": [c.digest for c in chain], "in_use_by": users}

    def human() -> None:
        console.print(f"digest:   {info.digest}")
        console.print(f"names:    {', '.join(info.names) or '-'}")
        console.print(f"source:   {info.source.model_dump_json()}")
        console.print(f"size:     {_size(info.size)} in {len(info.layers)} layers")
        console.print(f"created:  {info.created_at.isoformat()}")
        console.print(f"config:   {info.config.model_dump_json()}")
        console.print(f"in use:   {', '.join(users) or '-'}")
        console.print("lineage:")
        for depth, c in enumerate(chain):
            console.print(escape(f"  {'  ' * depth}{_summary(c)} [{c.source.type}]"))
        for layer in info.layers:
            console.print(f"  layer {layer.diff_id}  {_size(layer.size)}")

    emit(doc, json_, human)


@app.command("tag")
def tag_cmd(
    ref: str = typer.Argument(..., help="Digest, prefix or name."),
    name: str = typer.Argument(..., help="New name, e.g. myimage:1."),
    json_: bool = JSON_OPTION,
) -> None:
    """Give a baseline a name (moving the name if another baseline had it)."""
    info = _store().tag(ref, name)
    emit(info, json_, _summary(info))


@app.command("rm")
def rm_cmd(
    ref: str = typer.Argument(..., help="Digest, prefix or name."),
    force: bool = typer.Option(False, "--force", help="Remove even while sandboxes use it."),
    json_: bool = JSON_OPTION,
) -> None:
    """Remove a baseline (refused while a live sandbox uses it); `gc` frees the space."""
    info = _store().remove(ref, force=force)
    emit({"removed": info.digest}, json_, f"removed {info.digest}")


@app.command("gc")
def gc_cmd(
    dry_run: bool = typer.Option(False, "--dry-run", help="Only report what would go."),
    json_: bool = JSON_OPTION,
) -> None:
    """Remove blobs and unpacked layers no baseline or live sandbox references."""
    from rollbox.baselines.gc import gc

    report = gc(_store(), dry_run=dry_run)
    verb = "would free" if dry_run else "freed"
    emit(
        report,
        json_,
        f"{verb} {_size(report.bytes_freed)}: {len(report.blobs)} blobs, "
        f"{len(report.layers)} layers",
    )


@app.command("verify")
def verify_cmd(
    ref: str | None = typer.Argument(None, help="Digest, prefix or name (default: all)."),
    json_: bool = JSON_OPTION,
) -> None:
    """Re-hash blobs and unpacked layers; exit 1 naming each corrupt path."""
    from rollbox.baselines.verify import verify

    store = _store()
    infos = [store.resolve(ref)] if ref else None
    report = verify(store, infos)
    if report.ok:
        emit(
            report,
            json_,
            f"ok: {len(report.baselines)} baselines, {report.blobs_checked} blobs, "
            f"{report.layers_checked} layers",
        )
        return
    if json_:
        emit(report, True)
        raise typer.Exit(1)
    raise CorruptionError(
        f"{len(report.corrupt)} corrupt: " + "; ".join(report.corrupt[:20]), paths=report.corrupt
    )
