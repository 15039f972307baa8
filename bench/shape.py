#!/usr/bin/env python3
# The measures of the code's shape that issue 56 tracks, for a checkout:
# files over 600 lines and functions over 100 (the sources under
# crates/*/src, in-file tests included; a function runs from its `fn` line
# to the closing brace at its indentation), the proxy crate's share, the
# `Result<_, String>`s, and `Session`'s fields and methods. At 5a350ec it
# counts the 22 files and 34 functions.
#
#   bench/shape.py [REPO] [--list]   (default: this checkout)
import os
import re
import sys

args = [a for a in sys.argv[1:] if not a.startswith('--')]
root = args[0] if args else os.path.join(os.path.dirname(__file__), '..')
listing = '--list' in sys.argv

FN = re.compile(r'^(\s*)(pub(\([^)]*\))? )?(async )?(const )?(unsafe )?fn (\w+)')


def sources():
    for d, _, files in os.walk(os.path.join(root, 'crates')):
        if '/src' not in d or '/target' in d:
            continue
        for f in files:
            if f.endswith('.rs'):
                path = os.path.join(d, f)
                yield os.path.relpath(path, root), open(path).read().split('\n')


def long_functions(lines):
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith(('{', ';')):
            j += 1
        if j == len(lines) or lines[j].rstrip().endswith(';'):
            continue
        end = j + 1
        while end < len(lines) and lines[end].rstrip() != m.group(1) + '}':
            end += 1
        if end - i + 1 > 100:
            yield end - i + 1, m.group(7)


def string_errors(text):
    """`Result<T, String>`s, whatever T's generics."""
    count = 0
    for m in re.finditer(r'\bResult<', text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {'<': 1, '>': -1}.get(text[i], 0)
            i += 1
        count += text[m.end():i - 1].replace(' ', '').endswith(',String')
    return count


def session_methods():
    """Methods in `impl Session` blocks, and the files that have one."""
    methods, files = 0, 0
    for path, lines in sources():
        if not path.startswith('crates/proxy/'):
            continue
        text = '\n'.join(lines)
        blocks = re.findall(r'\nimpl Session \{(.*?)\n\}', text, re.S)
        methods += sum(len(re.findall(r'^    (pub[^ ]* )?(async )?fn ', b, re.M)) for b in blocks)
        files += bool(blocks)
    return methods, files


big, long, strings = [], [], 0
for path, lines in sources():
    if len(lines) - 1 > 600:
        big.append((len(lines) - 1, path))
    long += [(n, path, name) for n, name in long_functions(lines)]
    strings += string_errors('\n'.join(lines))

session = open(os.path.join(root, 'crates/proxy/src/session/mod.rs')).read()
fields = re.search(r'pub struct Session \{(.*?)\n\}', session, re.S)
in_proxy = lambda rows: sum(1 for row in rows if row[1].startswith('crates/proxy/'))
print(f'files over 600 lines: {len(big)} (proxy crate: {in_proxy(big)})')
print(f'functions over 100 lines: {len(long)} (proxy crate: {in_proxy(long)})')
print(f'Result<_, String>: {strings}')
if fields:
    count = len(re.findall(r'^    \w+:', fields.group(1), re.M))
    print(f'Session fields: {count}')
methods, files = session_methods()
print(f'impl Session: {methods} methods in {files} files')
if listing:
    for n, path in sorted(big, reverse=True):
        print(f'  {n:5} {path}')
    for n, path, name in sorted(long, reverse=True):
        print(f'  {n:5} {path} {name}')
