"""What a run costs: the model (inputs, model, runcheck), its prices (prices; aws_prices fetches and caches AWS's),
the report over a grid of shapes (report), this project's own measurements (measured), and the shell the commands
call (shell). The model, the prices and the report decide and import nothing that reaches a network, a process or
the clock; aws_prices, measured and shell read and write state, and the report writes its own directory.
"""
