"""kvnotes's commands: the `kvnotes` command line (`cli`), the engine commands it runs, the serving
replay (`replay`), accounts (`accounts`) and `serve` with the worker supervisor (`serve`,
`supervisor`). The top layer: it may import every layer below, and the web app only by its import
string.
"""
