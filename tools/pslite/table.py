"""The ps-lite comparison's table from compare.sh's output directories (argv[1:]).

One directory: each cell as "round 1 / round 2". Several (compare.sh run more than once,
to more rounds than two): each cell's median over all their rounds, and in brackets the
lowest ratio of a single round.
"""
import collections
import json
import statistics
import sys

dirs = sys.argv[1:]
SIZES = {4096: '4 KiB', 65536: '64 KiB', 1048576: '1 MiB', 16777216: '16 MiB', 67108864: '64 MiB'}


def load(out, name):
    return [json.loads(l) for l in open(f'{out}/{name}') if l.startswith('{')]


def fmt(x, digits=3):
    return f'%.{digits}f' % x if x else '-'


def rounds(shape):
    """Per cell (op, bytes, window), one (ps-lite, ActorPS tcp, ActorPS shm) per round; the TCP limits."""
    cells, limits = collections.OrderedDict(), []
    for out in dirs:
        for r in (1, 2):
            pslite = collections.defaultdict(float)
            for j in load(out, f'pl_{r}_{shape}.txt'):
                pslite[(j['op'], j['bytes'], j['window'])] += j['gbps']
            actorps = {}
            for j in load(out, f'ap_{r}_{shape}.txt'):
                if 'op' in j:
                    actorps[(j['op'], j['bytes'], j['window'], j['transport'])] = j['gbps']
                elif j.get('limit') == 'tcp_loopback':
                    limits.append(fmt(j['gbps'], 2))
            for k, v in pslite.items():
                cells.setdefault(k, []).append((v, actorps.get(k + ('tcp',)), actorps.get(k + ('shm',))))
    return cells, limits


def per_round(c):
    col = lambda i: ' / '.join(fmt(x[i]) for x in c)
    ratio = lambda i: ' / '.join(fmt(x[i] / x[0], 2) if x[i] and x[0] else '-' for x in c)
    return [col(0), col(1), ratio(1), col(2), ratio(2)]


def medians(c):
    med = lambda i: statistics.median(x[i] or 0 for x in c)
    ratios = lambda i: [x[i] / x[0] for x in c if x[i] and x[0]]
    ratio = lambda i: f'{fmt(statistics.median(ratios(i)), 2)} ({fmt(min(ratios(i)), 2)})' if ratios(i) else '-'
    return [fmt(med(0)), fmt(med(1)), ratio(1), fmt(med(2)), ratio(2)]


for shape in ['1x1', '2x2']:
    cells, limits = rounds(shape)
    print(f'{shape}: TCP limit {" / ".join(limits)} GB/s')
    print('| shape | size | op | window | ps-lite | ActorPS tcp | ratio | ActorPS shm | ratio |')
    print('|---|---|---|---|---|---|---|---|---|')
    for k in sorted(cells, key=lambda k: (k[1], k[0] != 'pull', k[2])):
        row = (per_round if len(dirs) == 1 else medians)(cells[k])
        print(f'| {shape} | {SIZES[k[1]]} | {k[0]} | {k[2]} | ' + ' | '.join(row) + ' |')
