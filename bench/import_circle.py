#!/usr/bin/env python3
# The largest import circle of the proxy crate (issue 56): files are nodes,
# a `crate::a::b` or `super::...` path in a file is an edge to the module
# file it names (the deepest that exists); prints the largest strongly
# connected component and its edges. Counts paths, not `mod` declarations.
#
#   bench/import_circle.py [REPO]   (default: this checkout)
import re,os,sys
root=(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..'))+'/crates/proxy/src'
files={}
for d,_,fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p=os.path.join(d,f); rel=os.path.relpath(p,root)
            files[rel]=open(p).read()
def mod_of(rel):
    parts=rel[:-3].split('/')
    if parts[-1] in ('mod','lib','main'): parts=parts[:-1]
    return tuple(parts)
mods={mod_of(r):r for r in files}
def resolve(path):
    path=tuple(path)
    while path:
        if path in mods: return mods[path]
        path=path[:-1]
    return None
edges={r:set() for r in files}
for r,s in files.items():
    s=re.sub(r'//.*','',s)
    me=mod_of(r)
    for m in re.finditer(r'crate::((?:\w+::)*\w+)', s):
        t=resolve(m.group(1).split('::'))
        if t and t!=r: edges[r].add(t)
    if re.search(r'super::\{', s):
        t=resolve(list(me[:-1]))
        if t and t!=r: edges[r].add(t)
    for m in re.finditer(r'super::((?:\w+::)*\w+)', s):
        base=me[:-1] if not r.endswith('mod.rs') else me[:-1]
        # super of a file module x/y.rs is x; of x/mod.rs is parent of x
        base = me[:-1]
        t=resolve(list(base)+m.group(1).split('::'))
        if t and t!=r: edges[r].add(t)
    # a parent module file depends on its children declared by mod
sys.setrecursionlimit(10000)
index={};low={};stack=[];on=set();sccs=[];i=[0]
def strong(v):
    index[v]=low[v]=i[0]; i[0]+=1; stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index: strong(w); low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],index[w])
    if low[v]==index[v]:
        c=[]
        while True:
            w=stack.pop(); on.discard(w); c.append(w)
            if w==v: break
        sccs.append(c)
for v in files:
    if v not in index: strong(v)
sccs.sort(key=len, reverse=True)
print(len(sccs[0]), sorted(sccs[0]))
c=set(sccs[0])
for v in sorted(c):
    print(v, '->', sorted(edges[v] & c))
