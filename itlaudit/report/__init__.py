"""Readable outputs: report.md, report.html and the PNG figures, from analysis results."""
