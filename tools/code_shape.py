#!/usr/bin/env python3
"""Files over a line limit and functions over a line limit, in the C++ sources.

A function counts from its opening line to its closing brace, lambdas inside included;
a function is a brace block whose header has a parameter list and that opens at
namespace or class level. Usage: code_shape.py ROOT [--file-limit=700] [--function-limit=60]
[--check] (exit 1 when anything is over; tests/ is left out of the file limit)."""
import os
import re
import sys

CONTROL = re.compile(r'^\s*(if|for|while|switch|catch|do|else)\b')
SCOPE = re.compile(r'\b(namespace|class|struct|union|enum)\b[^()]*$')


def strip(text):
    """Comments, strings and character literals out, newlines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            i = n if j < 0 else j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append('\n' * text.count('\n', i, j))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(')' + (m.group(1) if m else '') + '"', i)
            j = n if end < 0 else end + len(m.group(1) if m else '') + 2
            out.append('""' + '\n' * text.count('\n', i, j))
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def block_kind(header, in_function):
    """What a '{' after `header` opens: a function body, a scope (namespace, class, enum,
    extern) or a block (inside a function, or an initialiser)."""
    if in_function:
        return 'block'
    tail = header.strip()
    last_line = tail.split('\n')[-1]
    if SCOPE.search(tail) and not re.search(r'\)\s*(const|noexcept|override|final|->[^{]*|:[^{]*)?\s*$', tail):
        return 'scope'
    if ')' in tail and not CONTROL.match(last_line) and not tail.endswith('='):
        return 'function'
    return 'scope' if tail.startswith('extern') or not tail else 'block'


def functions(text):
    """(first line, last line, header's last line) of each function at namespace or class level."""
    code = strip(text)
    stack, found, header_start, line = [], [], 0, 1
    for i, c in enumerate(code):
        if c == '\n':
            line += 1
        elif c == '{':
            header = code[header_start:i]
            kind = block_kind(header, any(k == 'function' for k, _, _ in stack))
            stack.append((kind, line, header.strip()))
            header_start = i + 1
        elif c == '}':
            if stack:
                kind, start, header = stack.pop()
                if kind == 'function':
                    found.append((start, line, header.split('\n')[-1][:80]))
            header_start = i + 1
        elif c == ';':
            header_start = i + 1
    return found


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('--')]
    opts = dict(a[2:].split('=', 1) if '=' in a else (a[2:], '1') for a in sys.argv[1:] if a.startswith('--'))
    root = args[0] if args else '.'
    file_limit = int(opts.get('file-limit', 700))
    fn_limit = int(opts.get('function-limit', 60))
    over = 0
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(('.', 'build')))
        for f in sorted(files):
            if not f.endswith(('.cpp', '.hpp', '.cu', '.cuh')):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            text = open(path, encoding='utf-8', errors='replace').read()
            lines = text.count('\n')
            if lines > file_limit and not rel.startswith('tests' + os.sep):
                print(f'{rel}: {lines} lines (limit {file_limit})')
                over += 1
            for first, last, hs in functions(text):
                if last - first + 1 > fn_limit and not rel.startswith('tests' + os.sep):
                    print(f'{rel}:{first}: function of {last - first + 1} lines (limit {fn_limit}): {hs}')
                    over += 1
    if 'check' in opts and over:
        sys.exit(1)


if __name__ == '__main__':
    main()
