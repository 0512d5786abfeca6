#!/usr/bin/python3
"""Doxygen's input filter for the public headers (docs/Doxyfile, ./run docs).

The headers comment in plain `//`, the way the rest of the code does; Doxygen reads only
`///`. This turns, on the fly and without touching the files, a header's opening comment
into its file description and each comment block right above a declaration into that
declaration's description, escaping what Doxygen would read as markup (<tags>, #links,
@commands, backslashes, &). Comments above #include, namespace and other comments stay
plain. Usage: doxygen_filter.py FILE (prints the filtered file).
"""
import re
import sys

LEADING = re.compile(r"^(\s*)//(?!/)\s?(.*)$")
ESCAPES = [("\\", "\\\\"), ("@", "\\@"), ("<", "\\<"), (">", "\\>"), ("#", "\\#"), ("&", "\\&"), ("%", "\\%"),
           ("$", "\\$")]


def escaped(text):
    for raw, esc in ESCAPES:
        text = text.replace(raw, esc)
    return text


def documents(code_line):
    """Whether a comment block right above this line describes a declaration."""
    stripped = code_line.strip()
    if not stripped or stripped.startswith(("#", "namespace", "}", "//", "public:", "private:", "protected:")):
        return False
    return True


def filtered(lines):
    out = list(lines)
    i = 0
    file_doc_done = False
    while i < len(lines):
        if not LEADING.match(lines[i]):
            if lines[i].strip() and not lines[i].startswith("#pragma"):
                file_doc_done = True
            i += 1
            continue
        start = i
        while i < len(lines) and LEADING.match(lines[i]):
            i += 1
        block = [LEADING.match(line) for line in lines[start:i]]
        if not file_doc_done:  # the header's opening comment: the file's description
            out[start] = "/// \\file\n" + "".join(m.group(1) + "/// " + escaped(m.group(2)) + "\n"
                                                   for m in block[:1]).rstrip("\n")
            for k, m in enumerate(block[1:], start + 1):
                out[k] = m.group(1) + "/// " + escaped(m.group(2))
            file_doc_done = True
        elif i < len(lines) and documents(lines[i]):
            for k, m in enumerate(block, start):
                out[k] = m.group(1) + "/// " + escaped(m.group(2))
    return out


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        lines = f.read().split("\n")
    sys.stdout.write("\n".join(filtered(lines)))


if __name__ == "__main__":
    main()
