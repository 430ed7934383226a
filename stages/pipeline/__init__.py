"""The pipelines every entry point runs (the CLI with or without Prefect, the flows, the demo):
`op.tune_op` for one operator, `model.tune_model` for an ONNX model. Each step goes through a
`Steps` object, so a Prefect flow can make each step a task run and change nothing else."""
