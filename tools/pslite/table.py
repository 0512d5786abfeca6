"""The ps-lite comparison's table from compare.sh's output directory (argv[1])."""
import collections
import json
import sys

out = sys.argv[1]
SIZES = {4096: '4 KiB', 65536: '64 KiB', 1048576: '1 MiB', 16777216: '16 MiB', 67108864: '64 MiB'}


def load(name):
    return [json.loads(l) for l in open(f'{out}/{name}') if l.startswith('{')]


def fmt(x, digits=3):
    return f'%.{digits}f' % x if x else '-'


for shape in ['1x1', '2x2']:
    cells, limits = collections.OrderedDict(), []
    for r in (1, 2):
        pslite = collections.defaultdict(float)
        for j in load(f'pl_{r}_{shape}.txt'):
            pslite[(j['op'], j['bytes'], j['window'])] += j['gbps']
        actorps = {}
        for j in load(f'ap_{r}_{shape}.txt'):
            if 'op' in j:
                actorps[(j['op'], j['bytes'], j['window'], j['transport'])] = j['gbps']
            elif j.get('limit') == 'tcp_loopback':
                limits.append(fmt(j['gbps'], 2))
        for k, v in pslite.items():
            cells.setdefault(k, []).append((v, actorps.get(k + ('tcp',)), actorps.get(k + ('shm',))))
    print(f'{shape}: TCP limit {" / ".join(limits)} GB/s')
    print('| shape | size | op | window | ps-lite | ActorPS tcp | ratio | ActorPS shm | ratio |')
    print('|---|---|---|---|---|---|---|---|---|')
    for k in sorted(cells, key=lambda k: (k[1], k[0] != 'pull', k[2])):
        c = cells[k]
        col = lambda i: ' / '.join(fmt(x[i]) for x in c)
        ratio = lambda i: ' / '.join(fmt(x[i] / x[0], 2) if x[i] and x[0] else '-' for x in c)
        print(f'| {shape} | {SIZES[k[1]]} | {k[0]} | {k[2]} | {col(0)} | {col(1)} | {ratio(1)} | {col(2)} | {ratio(2)} |')
