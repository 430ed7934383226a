"""The `tunaflow` command line: registers one module per command."""

from __future__ import annotations

import typer

from tunaflow.commands import demo, log, log_check, log_plot, model, rpc, target, tasks, tune_op

app = typer.Typer(
    help="tunaflow: auto-tune tensor operators with LLVM, keep every trial in a Parquet log, "
         "orchestrated by Prefect.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
log_app = typer.Typer(help="Inspect, export and merge tuning logs.", no_args_is_help=True)
app.add_typer(log_app, name="log")
app.add_typer(rpc.tracker_app, name="tracker")
app.add_typer(rpc.runner_app, name="runner")

app.command("tune-op")(tune_op.tune_op)
app.command("target")(target.target)
app.command("tasks")(tasks.tasks)
app.command("tune")(model.tune)
app.command("build")(model.build)
app.command("run")(model.run)
app.command("demo")(demo.demo)
log_app.command("show")(log.log_show)
log_app.command("export")(log.log_export)
log_app.command("merge")(log.log_merge)
log_app.command("check")(log_check.log_check)
log_app.command("plot")(log_plot.log_plot)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
