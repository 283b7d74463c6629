"""Reports: Records -> tidy table -> the paper's table layouts -> figures.

Tables and figures read only the tidy table (and config/reference/ for the paper's
published values); they never run a cell.
"""
