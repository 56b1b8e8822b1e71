#!/usr/bin/env node
// validate.js - offline checks of rendered Kubernetes manifests (the output of
// `kubectl kustomize`), in the spirit of `kubeconform -strict`, plus checks of our own:
//
//   1. schema: every object against the Kubernetes OpenAPI schema of its apiVersion and kind
//      (kubernetes-models: types, enums, required fields; Kubernetes 1.27);
//   2. strict: no field the schema does not know, at any depth (a misspelt `readinesProbe` is
//      silently ignored by the API server; the field lists are @kubernetes/client-node's, from
//      the OpenAPI document of Kubernetes 1.30);
//   3. consistency of the MARLaaS deployment: every workload's containers have readiness and
//      liveness probes on a named port and CPU/memory requests and limits; every Service selects
//      pods and targets their named ports; the ConfigMap's endpoints (tcp://NAME:PORT, NAME:PORT)
//      name a Service with that port; envFrom / secretKeyRef / secret volumes name objects and
//      keys that exist; every MARLaaS container mounts the CURVE keys at MARLAAS_KEYS, with its
//      own service's secret and no other's, and none sets MARLAAS_INSECURE; Redis requires a
//      password and every MARLaaS container takes MARLAAS_REDIS_PASSWORD from a Secret;
//      HPA and PDB targets exist; NetworkPolicies deny by default, name ports the selected pods
//      have, and open no internal port to every source; the verifiers' Service is headless; every namespaced object is
//      in the namespace; with --gpu NAME,... those Deployments limit nvidia.com/gpu and tolerate
//      the GPU taint, and without it nothing asks for a GPU.
//
// usage: node validate.js [--gpu rollout,trainer] [--namespace marlaas] FILE.yaml...
// Prints one line per problem and exits 1 when there is any; prints a summary otherwise.
'use strict';
const fs = require('fs');
const path = require('path');
const YAML = require('yaml');

const args = process.argv.slice(2);
let gpu = null;
let namespace = 'marlaas';
const files = [];
for (let i = 0; i < args.length; i++) {
    if (args[i] === '--gpu') gpu = args[++i].split(',').filter(Boolean);
    else if (args[i] === '--namespace') namespace = args[++i];
    else files.push(args[i]);
}
if (files.length === 0) {
    console.error('usage: node validate.js [--gpu NAME,...] [--namespace NS] FILE.yaml...');
    process.exit(2);
}

const problems = [];
const bad = (obj, msg) => problems.push(`${obj ? `${obj.kind}/${obj.metadata && obj.metadata.name}: ` : ''}${msg}`);

// --- 1. schema -----------------------------------------------------------------------------------
function modelFor(apiVersion, kind) {
    const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : [null, apiVersion];
    const mod = group ? `kubernetes-models/${group}/${version}` : `kubernetes-models/${version}`;
    try {
        return require(mod)[kind] || null;
    } catch (e) {
        return null;
    }
}

// --- 2. strict: unknown fields -------------------------------------------------------------------
const MODEL_DIR = path.join(path.dirname(require.resolve('@kubernetes/client-node/package.json')), 'dist', 'gen', 'model');
const typeCache = new Map();
function typeMap(cls) {
    if (typeCache.has(cls)) return typeCache.get(cls);
    const file = path.join(MODEL_DIR, cls[0].toLowerCase() + cls.slice(1) + '.js');
    let map = null;
    if (fs.existsSync(file)) {
        const C = require(file)[cls];
        if (C && C.getAttributeTypeMap) map = C.getAttributeTypeMap();
    }
    typeCache.set(cls, map);
    return map;
}
function strict(value, type, where, obj) {
    if (value === null || value === undefined) return;
    let m;
    if ((m = /^Array<(.+)>$/.exec(type))) {
        if (Array.isArray(value)) value.forEach((v, i) => strict(v, m[1], `${where}[${i}]`, obj));
        return;
    }
    if ((m = /^\{ \[key: string\]: (.+); \}$/.exec(type))) {
        if (typeof value === 'object') for (const k of Object.keys(value)) strict(value[k], m[1], `${where}.${k}`, obj);
        return;
    }
    const map = typeMap(type);
    if (!map || typeof value !== 'object' || Array.isArray(value)) return;   // a scalar, IntOrString, any
    const known = new Map(map.map((a) => [a.baseName, a.type]));
    for (const k of Object.keys(value)) {
        if (!known.has(k)) bad(obj, `unknown field ${where ? where + '.' : ''}${k} (not in the ${type} schema)`);
        else strict(value[k], known.get(k), where ? `${where}.${k}` : k, obj);
    }
}
function clientClass(apiVersion, kind) {
    const version = apiVersion.split('/').pop();
    return version[0].toUpperCase() + version.slice(1) + kind;
}

// --- load ----------------------------------------------------------------------------------------
const objs = [];
for (const f of files) {
    const docs = YAML.parseAllDocuments(fs.readFileSync(f, 'utf8'));
    for (const d of docs) {
        if (d.errors.length) {
            bad(null, `${f}: YAML: ${d.errors[0].message}`);
            continue;
        }
        const o = d.toJS();
        if (o) objs.push(o);
    }
}
if (objs.length === 0) bad(null, 'no objects in the input');

for (const o of objs) {
    if (!o.apiVersion || !o.kind || !o.metadata || !o.metadata.name) {
        bad(o, 'apiVersion, kind and metadata.name are required');
        continue;
    }
    const M = modelFor(o.apiVersion, o.kind);
    if (!M) {
        bad(o, `unknown apiVersion/kind ${o.apiVersion} ${o.kind}`);
        continue;
    }
    try {
        new M(o).validate();
    } catch (e) {
        bad(o, `schema: ${e.message}`);
    }
    const cls = clientClass(o.apiVersion, o.kind);
    if (!typeMap(cls)) bad(o, `no field list for ${cls}`);
    else strict(o, cls, '', o);
}

// --- 3. consistency -----------------------------------------------------------------------------
const byKind = (k) => objs.filter((o) => o.kind === k);
const workloads = objs.filter((o) => ['Deployment', 'StatefulSet'].includes(o.kind));
const podLabels = (w) => (w.spec && w.spec.template && w.spec.template.metadata && w.spec.template.metadata.labels) || {};
const matches = (sel, labels) => sel && Object.keys(sel).length > 0 && Object.entries(sel).every(([k, v]) => labels[k] === v);
const containers = (w) => (w.spec && w.spec.template && w.spec.template.spec && w.spec.template.spec.containers) || [];
const portNames = (w) => new Set(containers(w).flatMap((c) => (c.ports || []).map((p) => p.name)));

for (const o of objs) {
    if (o.kind !== 'Namespace' && o.metadata.namespace !== namespace)
        bad(o, `namespace is '${o.metadata.namespace}', expected '${namespace}'`);
}
for (const w of workloads) {
    if (!matches(w.spec.selector && w.spec.selector.matchLabels, podLabels(w))) bad(w, 'selector does not match the pod labels');
    for (const c of containers(w)) {
        for (const p of ['readinessProbe', 'livenessProbe']) {
            const pr = c[p];
            if (!pr) bad(w, `container ${c.name} has no ${p}`);
            else if (pr.httpGet && typeof pr.httpGet.port === 'string' && !portNames(w).has(pr.httpGet.port))
                bad(w, `container ${c.name}: ${p} uses port '${pr.httpGet.port}', which no container port is named`);
        }
        const r = c.resources || {};
        for (const kind of ['requests', 'limits'])
            for (const res of ['cpu', 'memory'])
                if (!r[kind] || r[kind][res] === undefined) bad(w, `container ${c.name} has no resources.${kind}.${res}`);
        const wantsGpu = gpu && gpu.includes(w.metadata.name);
        const lim = (r.limits || {})['nvidia.com/gpu'];
        if (wantsGpu) {
            if (!(Number(lim) >= 1)) bad(w, `container ${c.name} does not limit nvidia.com/gpu`);
            const tol = w.spec.template.spec.tolerations || [];
            if (!tol.some((t) => t.key === 'nvidia.com/gpu')) bad(w, 'no toleration for the nvidia.com/gpu taint');
            if (!(c.env || []).some((e) => e.name === 'MARLAAS_BACKEND' && e.value === 'cuda'))
                bad(w, `container ${c.name} has a GPU but not MARLAAS_BACKEND=cuda`);
        } else if (lim !== undefined || ((r.requests || {})['nvidia.com/gpu'] !== undefined)) {
            bad(w, `container ${c.name} asks for nvidia.com/gpu`);
        }
        // CURVE keys: a secret volume mounted where MARLAAS_KEYS points, with this service's secret
        if (c.image && c.image.startsWith('marlaas')) {
            const keysDir = (byKind('ConfigMap').find((m) => (c.envFrom || []).some((ef) => ef.configMapRef &&
                ef.configMapRef.name === m.metadata.name)) || {data: {}}).data.MARLAAS_KEYS;
            const mount = (c.volumeMounts || []).find((m) => m.mountPath === keysDir);
            const vol = mount && (w.spec.template.spec.volumes || []).find((v) => v.name === mount.name);
            const items = vol && vol.secret ? (vol.secret.items || []).map((i) => i.key) : [];
            if (!keysDir) bad(w, `container ${c.name}: no MARLAAS_KEYS in its ConfigMap (links would be refused)`);
            else if (!vol || !vol.secret) bad(w, `container ${c.name} mounts no secret at MARLAAS_KEYS=${keysDir}`);
            else if (items.some((k) => k.endsWith('.key_secret') && k !== `${w.metadata.name}.key_secret`))
                bad(w, 'the keys volume holds another service\'s secret key');
            else if (!items.includes(`${w.metadata.name}.key_secret`)) bad(w, `the keys volume lacks ${w.metadata.name}.key_secret`);
            if ((c.env || []).some((e) => e.name === 'MARLAAS_INSECURE')) bad(w, `container ${c.name} sets MARLAAS_INSECURE`);
            const pw = (c.env || []).find((e) => e.name === 'MARLAAS_REDIS_PASSWORD');
            if (!pw || !(pw.valueFrom && pw.valueFrom.secretKeyRef))
                bad(w, `container ${c.name}: no MARLAAS_REDIS_PASSWORD from a Secret`);
        }
        if (c.image && c.image.startsWith('redis') && !(c.args || c.command || []).includes('--requirepass'))
            bad(w, `container ${c.name}: Redis without --requirepass`);
        for (const v of w.spec.template.spec.volumes || []) {
            if (!v.secret) continue;
            const s = byKind('Secret').find((x) => x.metadata.name === v.secret.secretName);
            const keys = s ? Object.keys({...(s.data || {}), ...(s.stringData || {})}) : [];
            if (!s) bad(w, `volume ${v.name} names secret ${v.secret.secretName}, which does not exist`);
            for (const it of v.secret.items || [])
                if (s && !keys.includes(it.key)) bad(w, `volume ${v.name}: secret ${s.metadata.name} has no key ${it.key}`);
        }
        for (const ef of c.envFrom || [])
            if (ef.configMapRef && !byKind('ConfigMap').some((m) => m.metadata.name === ef.configMapRef.name))
                bad(w, `envFrom names ConfigMap ${ef.configMapRef.name}, which does not exist`);
        for (const e of c.env || []) {
            const ref = e.valueFrom && e.valueFrom.secretKeyRef;
            if (!ref) continue;
            const s = byKind('Secret').find((x) => x.metadata.name === ref.name);
            const keys = s ? Object.keys({...(s.data || {}), ...(s.stringData || {})}) : [];
            if (!s || !keys.includes(ref.key)) bad(w, `env ${e.name} names secret ${ref.name} key ${ref.key}, which does not exist`);
        }
    }
}
if (gpu)
    for (const n of gpu)
        if (!workloads.some((w) => w.kind === 'Deployment' && w.metadata.name === n)) bad(null, `--gpu names Deployment ${n}, which does not exist`);
const services = byKind('Service');
for (const s of services) {
    const sel = s.spec.selector;
    const ws = workloads.filter((w) => matches(sel, podLabels(w)));
    if (ws.length === 0) {
        bad(s, 'selects no pods of any workload');
        continue;
    }
    for (const p of s.spec.ports || [])
        if (typeof p.targetPort === 'string' && !ws.some((w) => portNames(w).has(p.targetPort)))
            bad(s, `port ${p.name} targets '${p.targetPort}', which the selected pods do not name`);
}
const vs = services.find((s) => s.metadata.name === 'verifiers');
if (!vs) bad(null, 'no Service "verifiers"');
else if (vs.spec.clusterIP !== 'None') bad(vs, 'must be headless (clusterIP: None): rollouts connect to every verifier pod');
for (const cm of byKind('ConfigMap')) {
    for (const [k, v] of Object.entries(cm.data || {})) {
        const m = /^(?:tcp:\/\/)?([a-z0-9][-a-z0-9.]*):(\d+)$/.exec(v);
        if (!m || !k.startsWith('MARLAAS_')) continue;
        const s = services.find((x) => x.metadata.name === m[1]);
        if (!s) bad(cm, `${k}=${v}: no Service named ${m[1]}`);
        else if (!(s.spec.ports || []).some((p) => p.port === Number(m[2]))) bad(cm, `${k}=${v}: Service ${m[1]} has no port ${m[2]}`);
    }
}
for (const h of byKind('HorizontalPodAutoscaler')) {
    const t = h.spec.scaleTargetRef;
    if (!workloads.some((w) => w.kind === t.kind && w.metadata.name === t.name)) bad(h, `targets ${t.kind}/${t.name}, which does not exist`);
    const w = workloads.find((x) => x.metadata.name === t.name);
    if (w && w.spec.replicas !== undefined) bad(h, `${t.kind}/${t.name} sets replicas, which every apply would reset under the autoscaler`);
}
// NetworkPolicies: a default deny, each policy selects pods whose ports it names, and no internal
// port (everything but the API and HTTP) is open to every source
const nps = byKind('NetworkPolicy');
if (!nps.some((p) => Object.keys((p.spec.podSelector || {}).matchLabels || {}).length === 0 &&
                    !(p.spec.podSelector || {}).matchExpressions && !(p.spec.ingress || []).length &&
                    (p.spec.policyTypes || []).includes('Ingress')))
    bad(null, 'no default-deny NetworkPolicy (podSelector {}, policyTypes [Ingress], no ingress rule)');
for (const p of nps) {
    const sel = (p.spec.podSelector || {}).matchLabels || {};
    if (!Object.keys(sel).length) continue;
    const ws = workloads.filter((w) => matches(sel, podLabels(w)));
    if (!ws.length) { bad(p, 'selects no pods'); continue; }
    for (const rule of p.spec.ingress || []) {
        for (const port of rule.ports || []) {
            if (typeof port.port === 'string' && !ws.every((w) => portNames(w).has(port.port)))
                bad(p, `names port ${port.port}, which the selected pods do not name`);
            if (!rule.from && !['api', 'http'].includes(port.port))
                bad(p, `port ${port.port} is open to every source (internal ports name their peers in "from")`);
        }
    }
}
for (const p of byKind('PodDisruptionBudget'))
    if (!workloads.some((w) => matches(p.spec.selector && p.spec.selector.matchLabels, podLabels(w)))) bad(p, 'selects no pods');

if (problems.length) {
    for (const p of problems) console.log(`FAIL ${p}`);
    process.exit(1);
}
const kinds = {};
for (const o of objs) kinds[o.kind] = (kinds[o.kind] || 0) + 1;
console.log(`ok: ${objs.length} objects (${Object.entries(kinds).map(([k, n]) => `${n} ${k}`).join(', ')}): ` +
            `schema, strict fields and consistency checks passed${gpu ? `; GPUs on ${gpu.join(', ')}` : '; no GPU requested'}`);
