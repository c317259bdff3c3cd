"""Run reports: plots and Markdown read from run directories (``report.make_report``); nothing here trains."""
