"""Write a notebook from a compact cell list (used to author notebooks/ as code; outputs none).

Cells are separated by lines '# %% [markdown]', '# %%' or '# %% parameters' (tagged parameters).
Usage: python scripts/nbwrite.py SOURCE.py OUT.ipynb
"""
import sys

import nbformat


def convert(src: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    kind, tags, buf = None, [], []

    def flush():
        if kind is None:
            return
        text = "\n".join(buf).strip("\n")
        if kind == "markdown":
            text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in text.splitlines())
            nb.cells.append(nbformat.v4.new_markdown_cell(text))
        else:
            cell = nbformat.v4.new_code_cell(text)
            if tags:
                cell.metadata["tags"] = list(tags)
            nb.cells.append(cell)

    for line in src.splitlines():
        if line.startswith("# %%"):
            flush()
            rest = line[4:].strip()
            kind = "markdown" if rest == "[markdown]" else "code"
            tags = ["parameters"] if rest == "parameters" else []
            buf = []
        else:
            buf.append(line)
    flush()
    return nb


if __name__ == "__main__":
    nbformat.write(convert(open(sys.argv[1]).read()), sys.argv[2])
