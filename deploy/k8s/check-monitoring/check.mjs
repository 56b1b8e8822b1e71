#!/usr/bin/env node
// check.mjs - offline checks of the monitoring kit (deploy/k8s/components/monitoring): the Grafana
// dashboard, the alert rules and, rendered by `kubectl kustomize`, the objects of the component.
//
//   1. PromQL: every expression of the dashboard (its panels' targets and its variables'
//      label_values() selectors, with Grafana's variables put in) and of the rules parses with
//      Prometheus's own grammar (@prometheus-io/lezer-promql); every metric name is one the C code
//      exports (metrics_def / metrics_def_job calls and the families metrics.c renders itself,
//      read from the sources) or Prometheus's `up`; every label named in a matcher, by/without,
//      on/ignoring, a legend or an alert's annotations exists on the series there (job_id only on
//      per-job families, the target labels the PodMonitor gives every series); rate(),
//      increase(), irate() and resets() take counters, deriv(), delta(), idelta() and
//      predict_linear() gauges; a literal job="..." names a service.
//   2. Grafana: uid, title, schemaVersion, panels with unique ids, gridPos inside the 24 columns
//      and no two panels overlapping, a Prometheus datasource (the dashboard's datasource
//      variable) and targets with an expr and unique refIds on every panel but rows, every
//      variable used is defined.
//   3. Rules: a PrometheusRule (the operator's schema and field lists,
//      @kubernetes-models/prometheus-operator), unique group and alert names, and every alert
//      with a for:, a severity label (critical, warning or info) and summary and description
//      annotations.
//   4. Rendered (--manifests): the component's ConfigMap holds the dashboard file byte for byte
//      with the label grafana_dashboard: "1", its PrometheusRule is the rules file, and its
//      PodMonitor selects exactly the scheduler, rollout, verifier and trainer pods of the render,
//      on a port they name, with the job label taken from a label they carry; the objects of
//      Kubernetes' own kinds are written to --builtin-out for deploy/k8s/check/validate.js.
//
// With --promtool-dir DIR it writes DIR/rules.yaml (the PrometheusRule's groups, a Prometheus rule
// file), DIR/rules-for-tests.yaml (the same without annotations, for alerts_test.yaml) and
// DIR/dashboard-rules.yaml (each dashboard expression as a recording rule), for
// `promtool check rules` and `promtool test rules`.
//
// usage: node check.mjs --sources DIR... --dashboard FILE.json --rules FILE.yaml
//                       [--manifests RENDERED.yaml [--builtin-out FILE.yaml]] [--promtool-dir DIR]
// Prints one line per problem and exits 1 when there is any; prints a summary otherwise.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import YAML from 'yaml';
import { parser } from '@prometheus-io/lezer-promql';
import { PodMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor';
import { PrometheusRule } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule';

const args = process.argv.slice(2);
const opt = { sources: [], dashboard: null, rules: null, manifests: null, builtinOut: null, promtoolDir: null };
for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (a === '--sources') while (args[i + 1] && !args[i + 1].startsWith('--')) opt.sources.push(args[++i]);
    else if (a === '--dashboard') opt.dashboard = args[++i];
    else if (a === '--rules') opt.rules = args[++i];
    else if (a === '--manifests') opt.manifests = args[++i];
    else if (a === '--builtin-out') opt.builtinOut = args[++i];
    else if (a === '--promtool-dir') opt.promtoolDir = args[++i];
    else {
        console.error(`unknown argument ${a}`);
        process.exit(2);
    }
}
if (!opt.sources.length || !opt.dashboard || !opt.rules) {
    console.error('usage: node check.mjs --sources DIR... --dashboard FILE.json --rules FILE.yaml [--manifests FILE.yaml [--builtin-out FILE.yaml]] [--promtool-dir DIR]');
    process.exit(2);
}
const problems = [];
const bad = (where, msg) => problems.push(`${where}: ${msg}`);

// --- what the C code exports --------------------------------------------------------------------
// name -> {type: 'counter'|'gauge', labels: Set}
const metrics = new Map();
const services = new Set();
function walk(dir, out) {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
        const p = path.join(dir, e.name);
        if (e.isDirectory()) walk(p, out);
        else if (e.name.endsWith('.c')) out.push(p);
    }
    return out;
}
for (const dir of opt.sources) {
    for (const f of walk(dir, [])) {
        const src = fs.readFileSync(f, 'utf8');
        for (const m of src.matchAll(/metrics_def(_job)?\(\s*[^,()]+,\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)",\s*MET_(COUNTER|GAUGE)/g))
            metrics.set(m[2], { type: m[3].toLowerCase(), labels: new Set(m[1] ? ['job_id'] : []), where: f });
        // the families metrics_render writes itself (marlaas_info{service, id}, uptime, readiness, ...)
        for (const m of src.matchAll(/# TYPE (marlaas_[a-z0-9_]+) (gauge|counter)/g))
            metrics.set(m[1], { type: m[2], labels: new Set(m[1] === 'marlaas_info' ? ['service', 'id'] : []), where: f });
    }
    // services/NAME: the service names (the pods' app.kubernetes.io/name, the job label)
    if (path.basename(dir) === 'services')
        for (const e of fs.readdirSync(dir, { withFileTypes: true })) if (e.isDirectory()) services.add(e.name);
}
if (metrics.size < 40) bad('sources', `only ${metrics.size} metric families found in ${opt.sources.join(' ')}: the extraction is broken`);
if (services.size !== 4) bad('sources', `services found: ${[...services].join(', ') || 'none'} (expected scheduler, rollout, verifier, trainer)`);
// series Prometheus makes itself for every target
metrics.set('up', { type: 'gauge', labels: new Set(), where: 'Prometheus' });
// the labels the PodMonitor's scrape gives every series (the operator's target labels)
const TARGET_LABELS = new Set(['job', 'instance', 'namespace', 'pod', 'container', 'endpoint']);
const used = new Set();

// --- PromQL ---------------------------------------------------------------------------------------
const COUNTER_FNS = new Set(['rate', 'irate', 'increase', 'resets']);
const GAUGE_FNS = new Set(['deriv', 'delta', 'idelta', 'predict_linear', 'holt_winters', 'double_exponential_smoothing']);
const kids = (n) => {
    const out = [];
    for (let c = n.firstChild; c; c = c.nextSibling) out.push(c);
    return out;
};
const kid = (n, name) => kids(n).find((c) => c.name === name) || null;
const text = (src, n) => src.slice(n.from, n.to);
function unquote(s) {
    try {
        return s[0] === '`' ? s.slice(1, -1) : JSON.parse(s[0] === "'" ? `"${s.slice(1, -1).replace(/"/g, '\\"')}"` : s);
    } catch (e) {
        return s.slice(1, -1);
    }
}
// metric names inside a node
function metricsIn(src, n, out = new Set()) {
    if (n.name === 'VectorSelector') {
        const id = kid(n, 'Identifier');
        if (id) out.add(text(src, id));
    }
    for (const c of kids(n)) metricsIn(src, c, out);
    return out;
}
function labelsOfMetrics(names) {
    const s = new Set(TARGET_LABELS);
    for (const m of names) for (const l of (metrics.get(m) || { labels: [] }).labels) s.add(l);
    return s;
}
const grouping = (src, n) => (n ? kids(n).filter((c) => c.name === 'LabelName').map((c) => text(src, c)) : []);

// The labels a result may carry (null: a scalar). Approximates Prometheus's rules: aggregation
// keeps by(...), one-to-one matching with on(...) keeps those, set operators keep the left side.
function outLabels(src, n) {
    switch (n.name) {
        case 'PromQL':
        case 'ParenExpr':
        case 'OffsetExpr':
        case 'SubqueryExpr':
        case 'MatrixSelector':
        case 'StepInvariantExpr': {
            const inner = kids(n).find((c) => !['Offset', 'OffsetDurationExpr', 'DurationExpr', 'At'].includes(c.name) && !c.type.isError);
            return inner ? outLabels(src, inner) : null;
        }
        case 'VectorSelector':
            return labelsOfMetrics(metricsIn(src, n));
        case 'NumberDurationLiteral':
        case 'StringLiteral':
            return null;
        case 'UnaryExpr':
            return outLabels(src, kids(n)[kids(n).length - 1]);
        case 'FunctionCall': {
            const fn = text(src, kid(n, 'FunctionIdentifier'));
            const body = kids(kid(n, 'FunctionCallBody'));
            if (fn === 'absent' || fn === 'absent_over_time') {
                const l = new Set();
                const sel = body[0] && (body[0].name === 'MatrixSelector' ? kid(body[0], 'VectorSelector') : body[0]);
                const ms = sel && kid(sel, 'LabelMatchers');
                for (const m of ms ? kids(ms) : []) if (kid(m, 'MatchOp') && kid(kid(m, 'MatchOp'), 'EqlSingle')) l.add(text(src, kid(m, 'LabelName')));
                return l;
            }
            if (['vector', 'time', 'scalar', 'pi'].includes(fn)) return fn === 'vector' ? new Set() : null;
            for (const b of body) {
                const l = outLabels(src, b);
                if (l) return l;
            }
            return new Set();
        }
        case 'AggregateExpr': {
            const mod = kid(n, 'AggregateModifier');
            const op = text(src, kid(n, 'AggregateOp'));
            const body = kids(kid(n, 'FunctionCallBody'));
            const inner = outLabels(src, body[body.length - 1]) || new Set();
            if (['topk', 'bottomk', 'limitk', 'limit_ratio'].includes(op)) return inner;
            if (!mod) return new Set();
            const g = grouping(src, kid(mod, 'GroupingLabels'));
            if (kid(mod, 'By')) return new Set(g);
            return new Set([...inner].filter((l) => !g.includes(l)));
        }
        case 'BinaryExpr': {
            const parts = kids(n);
            const lhs = outLabels(src, parts[0]);
            const rhs = outLabels(src, parts[parts.length - 1]);
            const opNode = parts[1];
            const op = opNode ? opNode.name : '';
            if (lhs === null) return rhs;
            if (rhs === null) return lhs;
            if (op === 'And' || op === 'Unless') return lhs;
            if (op === 'Or') return new Set([...lhs, ...rhs]);
            const mm = kid(n, 'MatchingModifierClause');
            if (!mm) return lhs;
            const g = grouping(src, kid(mm, 'GroupingLabels'));
            const gl = kids(mm).find((c) => c.name === 'GroupLeft' || c.name === 'GroupRight');
            if (gl) {
                const extra = [];
                for (let c = gl.nextSibling; c; c = c.nextSibling) if (c.name === 'GroupingLabels') extra.push(...grouping(src, c));
                return new Set([...(gl.name === 'GroupLeft' ? lhs : rhs), ...extra]);
            }
            if (kid(mm, 'On')) return new Set(g);
            return new Set([...lhs].filter((l) => !g.includes(l)));
        }
        default:
            return new Set(TARGET_LABELS);
    }
}

// Checks one expression; returns its output labels (or null when it does not parse).
function checkExpr(where, expr) {
    if (typeof expr !== 'string' || !expr.trim()) {
        bad(where, 'no expression');
        return null;
    }
    const tree = parser.parse(expr);
    let syntax = null;
    tree.iterate({
        enter(n) {
            if (!syntax && n.type.isError) syntax = n.from;
        },
    });
    if (syntax !== null) {
        bad(where, `PromQL syntax error at column ${syntax + 1}: ${JSON.stringify(expr.slice(Math.max(0, syntax - 20), syntax + 20))} in ${JSON.stringify(expr)}`);
        return null;
    }
    const top = tree.topNode;
    const visit = (n) => {
        if (n.name === 'VectorSelector') {
            const id = kid(n, 'Identifier');
            const name = id ? text(expr, id) : null;
            if (!name) bad(where, `a selector without a metric name: ${text(expr, n)}`);
            else if (!metrics.has(name)) bad(where, `unknown metric ${name} (not exported by the C code nor made by Prometheus)`);
            else used.add(name);
            const ms = kid(n, 'LabelMatchers');
            for (const m of ms ? kids(ms) : []) {
                const ln = kid(m, 'LabelName');
                if (!ln) continue;
                const l = text(expr, ln);
                if (name && metrics.has(name) && !labelsOfMetrics([name]).has(l)) bad(where, `${name} has no label ${l}`);
                const val = kid(m, 'StringLiteral');
                if (l === 'job' && val) {
                    const v = unquote(text(expr, val));
                    if (/^[a-z|]+$/.test(v))
                        for (const s of v.split('|')) if (!services.has(s)) bad(where, `job="${s}" names no service (${[...services].join(', ')})`);
                }
            }
        } else if (n.name === 'FunctionCall') {
            const fn = text(expr, kid(n, 'FunctionIdentifier'));
            const arg = kids(kid(n, 'FunctionCallBody')).find((c) => c.name === 'MatrixSelector');
            const sel = arg && kid(arg, 'VectorSelector');
            const id = sel && kid(sel, 'Identifier');
            const m = id && metrics.get(text(expr, id));
            if (m && COUNTER_FNS.has(fn) && m.type !== 'counter') bad(where, `${fn}() of ${text(expr, id)}, a ${m.type} (it takes counters)`);
            if (m && GAUGE_FNS.has(fn) && m.type !== 'gauge') bad(where, `${fn}() of ${text(expr, id)}, a ${m.type} (use rate or increase)`);
        } else if (n.name === 'AggregateExpr' || n.name === 'BinaryExpr') {
            const clause = kid(n, n.name === 'AggregateExpr' ? 'AggregateModifier' : 'MatchingModifierClause');
            if (clause) {
                const avail = labelsOfMetrics(metricsIn(expr, n));
                for (const g of kids(clause).filter((c) => c.name === 'GroupingLabels'))
                    for (const l of grouping(expr, g)) if (!avail.has(l)) bad(where, `groups by ${l}, a label none of its series has`);
            }
        }
        for (const c of kids(n)) visit(c);
    };
    visit(top);
    return outLabels(expr, top) || new Set();
}

// --- the dashboard --------------------------------------------------------------------------------
const dashText = fs.readFileSync(opt.dashboard, 'utf8');
let dash = null;
try {
    dash = JSON.parse(dashText);
} catch (e) {
    bad(opt.dashboard, `not JSON: ${e.message}`);
}
const dashExprs = [];   // [record name, expr] for promtool
const BUILTINS = new Map([['__rate_interval', '5m'], ['__interval', '1m'], ['__range', '1h']]);
function substitute(where, expr, vars) {
    return expr.replace(/\$(?:\{(\w+)(?::\w+)?\}|(\w+))/g, (all, a, b) => {
        const v = a || b;
        if (BUILTINS.has(v)) return BUILTINS.get(v);
        if (!vars.has(v)) bad(where, `uses $${v}, which the dashboard does not define`);
        return '.*';   // a variable's value is a regular expression of label values (multi, All)
    });
}
const PANEL_TYPES = new Set(['timeseries', 'stat', 'gauge', 'bargauge', 'table', 'text', 'heatmap', 'piechart', 'row']);
let nPanels = 0;
if (dash) {
    const D = opt.dashboard;
    if (typeof dash.uid !== 'string' || !/^[A-Za-z0-9_-]{1,40}$/.test(dash.uid)) bad(D, `uid ${JSON.stringify(dash.uid)}: 1 to 40 letters, digits, - or _`);
    if (typeof dash.title !== 'string' || !dash.title) bad(D, 'no title');
    if (!Number.isInteger(dash.schemaVersion) || dash.schemaVersion < 30) bad(D, 'schemaVersion must be an integer >= 30');
    if (!dash.time || typeof dash.time.from !== 'string' || typeof dash.time.to !== 'string') bad(D, 'no time range');
    const list = dash.templating && Array.isArray(dash.templating.list) ? dash.templating.list : null;
    if (!list) bad(D, 'no templating.list');
    const vars = new Set();
    let dsVar = null;
    for (const v of list || []) {
        if (!v || typeof v.name !== 'string' || !/^\w+$/.test(v.name)) {
            bad(D, `a variable without a valid name: ${JSON.stringify(v && v.name)}`);
            continue;
        }
        if (vars.has(v.name)) bad(D, `variable ${v.name} defined twice`);
        vars.add(v.name);
        if (v.type === 'datasource') {
            if (v.query !== 'prometheus') bad(D, `variable ${v.name}: a datasource variable of type ${v.query}, not prometheus`);
            dsVar = v.name;
        }
    }
    if (!dsVar) bad(D, 'no datasource variable of type prometheus');
    const dsOk = (ds, where) => {
        if (!ds || ds.type !== 'prometheus' || ds.uid !== `\${${dsVar}}`) bad(where, `datasource must be {"type": "prometheus", "uid": "\${${dsVar}}"}, not ${JSON.stringify(ds)}`);
    };
    for (const v of list || []) {
        if (v.type !== 'query') continue;
        const where = `${D}: variable ${v.name}`;
        dsOk(v.datasource, where);
        const q = typeof v.query === 'string' ? v.query : v.query && v.query.query;
        const m = typeof q === 'string' && /^label_values\((?:(.*),\s*)?(\w+)\)$/.exec(q.trim());
        if (!m) {
            bad(where, `query ${JSON.stringify(q)}: expected label_values(SELECTOR, LABEL)`);
            continue;
        }
        if (v.definition !== undefined && v.definition !== q) bad(where, 'definition differs from query');
        if (m[1]) {
            const expr = substitute(where, m[1], vars);
            const labels = checkExpr(where, expr);
            if (labels && !labels.has(m[2])) bad(where, `label_values of ${m[2]}, a label ${m[1]} does not have`);
            dashExprs.push([`dashboard:variable_${v.name}`, expr]);
        } else if (!TARGET_LABELS.has(m[2])) bad(where, `label_values(${m[2]}): not a label of every series`);
    }
    const panels = Array.isArray(dash.panels) ? dash.panels : [];
    if (!panels.length) bad(D, 'no panels');
    const ids = new Map();
    const boxes = [];
    const all = [];
    for (const p of panels) {
        all.push(p);
        if (p && p.type === 'row' && Array.isArray(p.panels)) all.push(...p.panels);
    }
    for (const p of all) {
        nPanels++;
        const where = `${D}: panel ${p && p.id} "${p && p.title}"`;
        if (!p || typeof p !== 'object') {
            bad(D, 'a panel that is not an object');
            continue;
        }
        if (!Number.isInteger(p.id) || p.id < 1) bad(where, 'id must be a positive integer');
        else if (ids.has(p.id)) bad(where, `duplicate panel id ${p.id} (also "${ids.get(p.id)}")`);
        else ids.set(p.id, p.title);
        if (!PANEL_TYPES.has(p.type)) bad(where, `unknown panel type ${p.type}`);
        if (typeof p.title !== 'string' || !p.title) bad(where, 'no title');
        const g = p.gridPos || {};
        if (!['x', 'y', 'w', 'h'].every((k) => Number.isInteger(g[k]))) bad(where, `gridPos ${JSON.stringify(p.gridPos)}: x, y, w, h must be integers`);
        else if (g.x < 0 || g.y < 0 || g.w < 1 || g.h < 1 || g.x + g.w > 24) bad(where, `gridPos ${JSON.stringify(g)} outside the 24 columns`);
        else if (p.type === 'row' && (g.w !== 24 || g.h !== 1 || g.x !== 0)) bad(where, 'a row spans x 0, w 24, h 1');
        else if (panels.includes(p)) {
            for (const [o, og] of boxes)
                if (g.x < og.x + og.w && og.x < g.x + g.w && g.y < og.y + og.h && og.y < g.y + g.h)
                    bad(where, `gridPos ${JSON.stringify(g)} overlaps panel ${o.id} "${o.title}" ${JSON.stringify(og)}`);
            boxes.push([p, g]);
        }
        if (p.type === 'row' || p.type === 'text') continue;
        dsOk(p.datasource, where);
        if (!Array.isArray(p.targets) || !p.targets.length) {
            bad(where, 'no targets');
            continue;
        }
        const refs = new Set();
        for (const t of p.targets) {
            const tw = `${where} target ${t && t.refId}`;
            if (!t || typeof t.refId !== 'string' || !t.refId) bad(tw, 'no refId');
            else if (refs.has(t.refId)) bad(tw, 'duplicate refId');
            else refs.add(t.refId);
            if (t && t.datasource) dsOk(t.datasource, tw);
            if (!t || typeof t.expr !== 'string' || !t.expr.trim()) {
                bad(tw, 'no expr');
                continue;
            }
            const expr = substitute(tw, t.expr, vars);
            const labels = checkExpr(tw, expr);
            for (const m of (t.legendFormat || '').matchAll(/\{\{\s*(\w+)\s*\}\}/g))
                if (labels && !labels.has(m[1])) bad(tw, `legend {{${m[1]}}}: the expression's series have no label ${m[1]}`);
            dashExprs.push([`dashboard:panel_${p.id}_${t.refId}`, expr]);
        }
    }
}

// --- the rules ------------------------------------------------------------------------------------
const OPERATOR_TYPES = path.join(path.dirname(createRequire(import.meta.url).resolve('@kubernetes-models/prometheus-operator/package.json')),
    'monitoring.coreos.com', 'v1');
// The fields of an operator API kind at every depth, from the package's declarations
// (PodMonitor.d.ts: nested `"name"?: type;` members, four spaces a level): path -> Set of names,
// or 'map' for an object of any keys ([key: string]: ...).
const treeCache = new Map();
function fieldTree(kind) {
    if (treeCache.has(kind)) return treeCache.get(kind);
    const tree = new Map();
    const f = path.join(OPERATOR_TYPES, `${kind}.d.ts`);
    const src = fs.existsSync(f) ? fs.readFileSync(f, 'utf8') : '';
    const body = src.slice(src.indexOf(`export interface I${kind} {`)).split('\n');
    const stack = [];
    for (const line of body.slice(1)) {
        if (/^}/.test(line)) break;
        let m = /^( +)"([^"]+)"\??: (.*)$/.exec(line);
        if (m) {
            const depth = m[1].length / 4;
            stack.length = depth - 1;
            const parent = stack.join('.');
            if (!tree.has(parent)) tree.set(parent, new Set());
            if (tree.get(parent) !== 'map') tree.get(parent).add(m[2]);
            if (/\{$/.test(m[3])) stack.push(m[2]);
        } else if ((m = /^( +)\[key: string\]/.exec(line))) {
            stack.length = m[1].length / 4 - 1;
            tree.set(stack.join('.'), 'map');
        }
    }
    treeCache.set(kind, tree);
    return tree;
}
// No field the operator's API does not know, at any depth (the API server would drop it).
function strict(where, obj, kind) {
    const tree = fieldTree(kind);
    if (!tree.size) {
        bad(where, `no field list for ${kind}`);
        return;
    }
    const walk = (v, p) => {
        if (Array.isArray(v)) return v.forEach((x) => walk(x, p));
        if (!v || typeof v !== 'object') return;
        const known = tree.get(p);
        if (!known || known === 'map') return;
        for (const [k, x] of Object.entries(v)) {
            const kp = p ? `${p}.${k}` : k;
            if (!known.has(k)) bad(where, `unknown field ${kp} (not in the operator's ${kind})`);
            else walk(x, kp);
        }
    };
    walk(obj, '');
}
function schema(where, o, Model) {
    try {
        new Model(o).validate();
    } catch (e) {
        bad(where, `schema: ${e.message}`);
    }
}

const rulesText = fs.readFileSync(opt.rules, 'utf8');
let rules = null;
try {
    rules = YAML.parse(rulesText);
} catch (e) {
    bad(opt.rules, `YAML: ${e.message}`);
}
let nAlerts = 0;
const SEVERITIES = new Set(['critical', 'warning', 'info']);
function checkRules(R, o) {
    if (!o || o.apiVersion !== 'monitoring.coreos.com/v1' || o.kind !== 'PrometheusRule') {
        bad(R, 'not a monitoring.coreos.com/v1 PrometheusRule');
        return;
    }
    schema(R, o, PrometheusRule);
    strict(R, o, 'PrometheusRule');
    const groups = (o.spec && o.spec.groups) || [];
    if (!groups.length) bad(R, 'no rule groups');
    const gnames = new Set(), anames = new Set();
    for (const g of groups) {
        const gw = `${R}: group ${g.name}`;
        if (gnames.has(g.name)) bad(gw, 'duplicate group name');
        gnames.add(g.name);
        if (!Array.isArray(g.rules) || !g.rules.length) bad(gw, 'no rules');
        for (const r of g.rules || []) {
            const rw = `${gw}: ${r.alert || r.record}`;
            const labels = checkExpr(rw, typeof r.expr === 'string' ? r.expr : String(r.expr));
            if (!r.alert) continue;
            nAlerts++;
            if (!/^[A-Z][A-Za-z0-9]+$/.test(r.alert)) bad(rw, 'alert names are CamelCase');
            if (anames.has(r.alert)) bad(rw, 'duplicate alert name');
            anames.add(r.alert);
            if (typeof r.for !== 'string' || !/^([0-9]+(ms|[smhdwy]))+$/.test(r.for)) bad(rw, `no for: duration (${JSON.stringify(r.for)})`);
            if (!r.labels || !SEVERITIES.has(r.labels.severity)) bad(rw, `severity label must be one of ${[...SEVERITIES].join(', ')}`);
            const an = r.annotations || {};
            for (const k of ['summary', 'description'])
                if (typeof an[k] !== 'string' || an[k].trim().length < (k === 'description' ? 80 : 10)) bad(rw, `no ${k} annotation saying what happened and what to do`);
            for (const [k, v] of Object.entries(an))
                for (const m of String(v).matchAll(/\$labels\.(\w+)/g))
                    if (labels && !labels.has(m[1])) bad(rw, `annotation ${k} uses $labels.${m[1]}, which the alert's series do not have`);
        }
    }
}
if (rules) checkRules(opt.rules, rules);

// --- the rendered component -----------------------------------------------------------------------
// JSON with object keys sorted (kustomize writes keys in its own order)
const canon = (v) =>
    Array.isArray(v) ? `[${v.map(canon).join(',')}]`
        : v && typeof v === 'object' ? `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canon(v[k])}`).join(',')}}`
            : JSON.stringify(v);
const builtin = [];
let rendered = '';
if (opt.manifests) {
    const M = opt.manifests;
    const objs = [];
    for (const d of YAML.parseAllDocuments(fs.readFileSync(M, 'utf8'))) {
        if (d.errors.length) bad(M, `YAML: ${d.errors[0].message}`);
        const o = d.toJS();
        if (!o) continue;
        objs.push(o);
        if (!d.errors.length && !String(o.apiVersion).startsWith('monitoring.coreos.com/')) builtin.push(d.toString());
    }
    const of = (kind) => objs.filter((o) => o.kind === kind);
    const crd = objs.filter((o) => String(o.apiVersion).startsWith('monitoring.coreos.com/'));
    const known = new Set(['PodMonitor', 'PrometheusRule']);
    for (const o of crd) if (!known.has(o.kind)) bad(M, `unexpected ${o.kind} ${o.metadata && o.metadata.name}`);
    const pods = objs.filter((o) => ['Deployment', 'StatefulSet'].includes(o.kind));
    const nsOf = (o) => (o.metadata && o.metadata.namespace) || '';
    const ns = nsOf(pods.find((w) => w.metadata.name === 'scheduler') || {});
    // the dashboard ConfigMap
    const cms = of('ConfigMap').filter((c) => c.metadata.labels && c.metadata.labels.grafana_dashboard !== undefined);
    if (cms.length !== 1) bad(M, `${cms.length} ConfigMaps labelled grafana_dashboard (expected 1)`);
    for (const c of cms) {
        const w = `${M}: ConfigMap/${c.metadata.name}`;
        if (c.metadata.labels.grafana_dashboard !== '1') bad(w, `label grafana_dashboard: ${JSON.stringify(c.metadata.labels.grafana_dashboard)}, the sidecar looks for "1"`);
        const keys = Object.keys(c.data || {});
        if (keys.length !== 1 || !keys[0].endsWith('.json')) bad(w, `data keys ${keys.join(', ')}: one FILE.json`);
        else if (c.data[keys[0]] !== dashText) bad(w, `data ${keys[0]} is not ${opt.dashboard}`);
        if (nsOf(c) !== ns) bad(w, `namespace ${nsOf(c)}, the services are in ${ns}`);
        if (/-[a-z0-9]{10}$/.test(c.metadata.name)) bad(w, 'a name with a hash suffix: each change would leave the old dashboard behind');
    }
    // the rules
    const prs = of('PrometheusRule');
    if (prs.length !== 1) bad(M, `${prs.length} PrometheusRules (expected 1)`);
    for (const r of prs) {
        checkRules(`${M}: PrometheusRule/${r.metadata.name}`, r);
        if (rules && canon(r.spec) !== canon(rules.spec)) bad(`${M}: PrometheusRule/${r.metadata.name}`, `spec differs from ${opt.rules}`);
        if (nsOf(r) !== ns) bad(`${M}: PrometheusRule/${r.metadata.name}`, `namespace ${nsOf(r)}, the services are in ${ns}`);
    }
    // the scrape
    const pms = of('PodMonitor');
    if (pms.length < 1) bad(M, 'no PodMonitor');
    const scraped = new Map();   // workload -> port name
    for (const p of pms) {
        const w = `${M}: PodMonitor/${p.metadata.name}`;
        schema(w, p, PodMonitor);
        strict(w, p, 'PodMonitor');
        if (nsOf(p) !== ns) bad(w, `namespace ${nsOf(p)}, the services are in ${ns}`);
        const sel = (p.spec && p.spec.selector) || {};
        const match = (labels) =>
            Object.entries(sel.matchLabels || {}).every(([k, v]) => labels[k] === v) &&
            (sel.matchExpressions || []).every((e) => {
                const has = Object.prototype.hasOwnProperty.call(labels, e.key);
                if (e.operator === 'In') return has && e.values.includes(labels[e.key]);
                if (e.operator === 'NotIn') return !has || !e.values.includes(labels[e.key]);
                if (e.operator === 'Exists') return has;
                if (e.operator === 'DoesNotExist') return !has;
                return false;
            });
        if (!sel.matchLabels && !sel.matchExpressions) bad(w, 'an empty selector scrapes every pod of the namespace (Redis too)');
        for (const e of p.spec.podMetricsEndpoints || [])
            if (e.path && e.path !== '/metrics') bad(w, `path ${e.path}: the services serve /metrics`);
        for (const wl of pods) {
            const labels = (wl.spec.template.metadata && wl.spec.template.metadata.labels) || {};
            if (!match(labels)) continue;
            const ports = new Set(wl.spec.template.spec.containers.flatMap((c) => (c.ports || []).map((x) => x.name)));
            for (const e of p.spec.podMetricsEndpoints || [])
                if (!ports.has(e.port)) bad(w, `port ${e.port}: ${wl.kind}/${wl.metadata.name}'s pods name no such port`);
            const job = p.spec.jobLabel ? labels[p.spec.jobLabel] : null;
            if (!job) bad(w, `jobLabel ${p.spec.jobLabel}: ${wl.metadata.name}'s pods have no such label, the job label would be ${nsOf(p)}/${p.metadata.name}`);
            else if (job !== wl.metadata.name) bad(w, `${wl.metadata.name}'s pods get job="${job}"`);
            if (scraped.has(wl.metadata.name)) bad(w, `${wl.metadata.name} scraped twice`);
            scraped.set(wl.metadata.name, p.metadata.name);
        }
    }
    const want = [...services].sort().join(', ');
    const got = [...scraped.keys()].sort().join(', ');
    if (got !== want) bad(M, `the PodMonitors scrape ${got || 'nothing'}; expected exactly ${want}`);
    rendered = `; rendered: ${pms.length} PodMonitor scraping ${got}, ${prs.length} PrometheusRule, ${cms.length} dashboard ConfigMap`;
    if (opt.builtinOut) fs.writeFileSync(opt.builtinOut, builtin.join('---\n'));
}

// --- for promtool ---------------------------------------------------------------------------------
if (opt.promtoolDir) {
    fs.mkdirSync(opt.promtoolDir, { recursive: true });
    if (rules && rules.spec) {
        fs.writeFileSync(path.join(opt.promtoolDir, 'rules.yaml'), YAML.stringify({ groups: rules.spec.groups }));
        // for the alert unit tests: the same rules without annotations (promtool compares them too)
        const bare = (rules.spec.groups || []).map((g) => ({ ...g, rules: (g.rules || []).map(({ annotations, ...r }) => r) }));
        fs.writeFileSync(path.join(opt.promtoolDir, 'rules-for-tests.yaml'), YAML.stringify({ groups: bare }));
    }
    fs.writeFileSync(path.join(opt.promtoolDir, 'dashboard-rules.yaml'),
        YAML.stringify({ groups: [{ name: 'dashboard', rules: dashExprs.map(([record, expr]) => ({ record, expr })) }] }));
}

if (problems.length) {
    for (const p of problems) console.log(p);
    process.exit(1);
}
const unused = [...metrics.keys()].filter((m) => !used.has(m));
console.log(`${nPanels} panels, ${dashExprs.length} dashboard expressions, ${nAlerts} alerts: every expression parses, ` +
    `${used.size} metrics used, all exported by the C code (${metrics.size - 1} families; not shown: ${unused.join(", ") || "none"})${rendered}`);
