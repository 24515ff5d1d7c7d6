"""Markdown shared by the benchmark pages of make_figures.py: who measured a result, tables
and numbers."""


def measured_by(data: dict) -> str:
    return f"{data['device']}, {data['date'][:10]}, git {data['git_rev']}"


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def number(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"
