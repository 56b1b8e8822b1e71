// check.mjs - the web console in a real browser (headless Chromium through puppeteer-core; the
// system's Chromium, no browser download). Called by tests/integration/test_console.sh with the
// settings in the environment:
//   CONSOLE_URL, TOKEN_A (tenant A), TOKEN_ADMIN, JOB_LIVE (A's job that trains during the test),
//   JOB_XSS (A's job named <script>alert(1)</script>), JOB_B (tenant B's job), SHOTS (directory
//   for the screenshots), CHROMIUM (the browser's path).
// Prints "ok: ..." per check and "FAILED: ..." per failure; exits 1 when anything failed.
import puppeteer from 'puppeteer-core';

const env = (k) => {
  const v = process.env[k];
  if (!v) { console.log(`FAILED: ${k} not set`); process.exit(1); }
  return v;
};
const URL0 = env('CONSOLE_URL'), TA = env('TOKEN_A'), TADM = env('TOKEN_ADMIN');
const JOB_LIVE = env('JOB_LIVE'), JOB_XSS = env('JOB_XSS'), JOB_B = env('JOB_B'), SHOTS = env('SHOTS');
const XSS = '<script>alert(1)</script>';
let failed = 0;
const check = (what, ok, detail = '') => {
  if (ok) console.log(`ok: ${what}`);
  else { failed++; console.log(`FAILED: ${what}${detail ? ' (' + detail + ')' : ''}`); }
};

const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
});
const dialogs = [], urls = [], consoleErrors = [];
async function newPage() {
  const page = await browser.newPage();
  await page.setViewport({width: 1400, height: 900});
  page.on('dialog', async (d) => { dialogs.push(d.message()); await d.dismiss(); });
  page.on('request', (r) => urls.push(r.url()));
  page.on('framenavigated', (f) => urls.push(f.url()));
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  return page;
}
const points = (page, chart) => page.$eval(`[data-chart="${chart}"] svg`, (s) => Number(s.getAttribute('data-points')))
  .catch(() => -1);
async function login(page, token) {
  await page.goto(URL0, {waitUntil: 'domcontentloaded'});
  await page.waitForSelector('#view-login:not([hidden])', {timeout: 10000});
  await page.type('#token', token);
  await page.click('#login-form button[type=submit]');
  await page.waitForSelector('#view-jobs:not([hidden]) #jobs-table tbody tr', {timeout: 15000});
}

try {
  // --- tenant A ------------------------------------------------------------------------------
  const page = await newPage();
  await login(page, TA);
  const rows = await page.$$eval('#jobs-table tbody tr', (trs) => trs.map((t) => t.getAttribute('data-job')));
  check('jobs table lists A\'s jobs', rows.includes(JOB_LIVE) && rows.includes(JOB_XSS), rows.join(','));
  check('jobs table hides B\'s job', !rows.includes(JOB_B), rows.join(','));
  const name = await page.$eval(`tr[data-job="${JOB_XSS}"] td[data-key="name"]`, (td) => td.textContent);
  check('a job named <script>alert(1)</script> shows its name literally', name === XSS, JSON.stringify(name));
  const scripts = await page.$$eval('main script', (s) => s.length);
  check('no script element inside the page\'s content', scripts === 0, `${scripts}`);
  const cookies = await page.cookies();
  const sess = cookies.find((c) => c.name === 'marlaas_session');
  check('session cookie HttpOnly, SameSite=Strict, Path=/, with an expiry',
        sess && sess.httpOnly && sess.sameSite === 'Strict' && sess.path === '/' && sess.expires > Date.now() / 1000,
        JSON.stringify(sess));
  const docCookie = await page.evaluate(() => document.cookie);
  check('the session cookie is out of the script\'s reach', !docCookie.includes('marlaas_session'), docCookie);
  const statusCol = await page.$$eval('#jobs-table thead th', (ths) => ths.map((t) => t.textContent));
  check('jobs table has the status, step, reward, eval, cost columns',
        ['Status', 'Step', 'Reward', 'Tokens', 'Cost share'].every((c) => statusCol.some((t) => t.startsWith(c))),
        statusCol.join('|'));
  // sorting from the keyboard: Tab to the header button, Enter
  await page.focus('#jobs-table th[data-key="step"] button');
  await page.keyboard.press('Enter');
  await page.waitForSelector('#jobs-table th[data-key="step"][aria-sort="ascending"]', {timeout: 3000})
    .then(() => check('a header sorts from the keyboard (aria-sort ascending)', true))
    .catch(() => check('a header sorts from the keyboard (aria-sort ascending)', false));
  await page.keyboard.press('Enter');
  await page.waitForSelector('#jobs-table th[data-key="step"][aria-sort="descending"]', {timeout: 3000})
    .then(() => check('pressed again it sorts descending', true))
    .catch(() => check('pressed again it sorts descending', false));
  await page.screenshot({path: `${SHOTS}/console-jobs.png`});

  // the job page: the reward curve gains points while the job trains, without a reload
  await page.click(`tr[data-job="${JOB_LIVE}"] td[data-key="id"] a`);
  await page.waitForSelector('#view-job:not([hidden]) [data-chart="reward"] svg', {timeout: 10000});
  await page.waitForFunction(() => Number(document.querySelector('[data-chart="reward"] svg').getAttribute('data-points')) > 0,
                             {timeout: 30000}).catch(() => {});
  const n1 = await points(page, 'reward');
  const marker = await page.evaluate(() => { window.__same_page = 1; return 1; });
  await page.waitForFunction((n) => Number(document.querySelector('[data-chart="reward"] svg').getAttribute('data-points')) > n,
                             {timeout: 60000}, n1).catch(() => {});
  const n2 = await points(page, 'reward');
  const same = await page.evaluate(() => window.__same_page === 1);
  check(`the reward curve gains points while ${JOB_LIVE} trains (${n1} -> ${n2}), no page reload`, n1 > 0 && n2 > n1 && same && marker === 1);
  for (const c of ['kl', 'entropy', 'clip_frac', 'staleness', 'eval_acc', 'tokens_per_s'])
    check(`job page has the ${c} chart`, (await page.$(`[data-chart="${c}"] svg`)) !== null);
  const band = await page.$('[data-chart="eval_acc"] polygon');
  check('eval accuracy has its 95 % interval band', band !== null);
  check('the reward curve has its spread band (mean +- std)', (await page.$('[data-chart="reward"] polygon')) !== null);
  const spec = await page.$eval('#job-spec', (p) => p.textContent);
  check('the spec is shown', spec.includes('"task"'), spec.slice(0, 80));
  const best = await page.$$eval('#job-best a', (as) => as.map((a) => a.getAttribute('href')));
  check('the best evaluated version with its download link', best.length === 1 && best[0].endsWith('&best=1'), best.join(','));
  const adapters = await page.$$eval('#job-adapters a', (as) => as.map((a) => a.getAttribute('href')));
  check('adapter versions with download links', adapters.length > 0 && adapters.every((h) => h.startsWith('/api/adapter?id=')),
        adapters.join(','));
  const samples = await page.$$eval('#job-samples .sample pre.completion', (ps) => ps.map((p) => p.textContent));
  check(`sample completions with their rewards (${samples.length})`, samples.length > 0 && samples.length <= 8);
  const prompts = await page.$$eval('#job-samples .sample pre.prompt', (ps) => ps.map((p) => p.textContent));
  check(`each sample with its prompt (${prompts.length})`, prompts.length === samples.length && prompts.every((p) => p.length > 0),
        JSON.stringify(prompts.slice(0, 2)));
  const cancelVisible = await page.$eval('#cancel', (b) => !b.hidden);
  check('the tenant sees a cancel button on its running job', cancelVisible);
  await page.screenshot({path: `${SHOTS}/console-job.png`, fullPage: true});

  // the XSS job's own page: the name is text
  await page.goto(`${URL0}#/job/${JOB_XSS}`, {waitUntil: 'domcontentloaded'});
  await page.waitForFunction((x) => document.querySelector('#job-title').textContent.includes(x), {timeout: 10000}, XSS)
    .then(() => check('the job page shows the hostile name literally', true))
    .catch(() => check('the job page shows the hostile name literally', false));
  // B's job by URL: the same answer as an unknown job
  await page.goto(`${URL0}#/job/${JOB_B}`, {waitUntil: 'domcontentloaded'});
  await page.waitForFunction(() => /no such job/.test(document.querySelector('#job-summary').textContent), {timeout: 10000})
    .then(() => check('B\'s job by URL: "no such job"', true))
    .catch(() => check('B\'s job by URL: "no such job"', false));
  const leaked = await page.$eval('#job-spec', (p) => p.textContent);
  check('nothing of B\'s job (or an earlier job) on the page', leaked === '', leaked.slice(0, 80));

  // compare: two jobs overlaid
  await page.goto(`${URL0}#/compare`, {waitUntil: 'domcontentloaded'});
  await page.waitForSelector(`#compare-pick input[value="${JOB_LIVE}"]`, {timeout: 10000});
  await page.click(`#compare-pick input[value="${JOB_LIVE}"]`);
  await page.click(`#compare-pick input[value="${JOB_XSS}"]`);
  await page.waitForFunction(() => document.querySelectorAll('[data-chart="reward"] polyline').length === 2, {timeout: 10000})
    .then(() => check('compare overlays the two jobs\' reward curves', true))
    .catch(() => check('compare overlays the two jobs\' reward curves', false));
  await page.screenshot({path: `${SHOTS}/console-compare.png`});
  await page.goto(`${URL0}#/jobs`, {waitUntil: 'domcontentloaded'});
  await page.waitForSelector('#logout', {visible: true});
  await page.click('#logout');
  await page.waitForSelector('#view-login:not([hidden])', {timeout: 5000})
    .then(() => check('logout returns to the login page', true))
    .catch(() => check('logout returns to the login page', false));
  const after = (await page.cookies()).find((c) => c.name === 'marlaas_session');
  check('logout removes the cookie', !after || !after.value, JSON.stringify(after));
  await page.close();

  // --- the admin: every tenant, read-only, the cluster view -----------------------------------
  const adm = await newPage();
  await login(adm, TADM);
  const all = await adm.$$eval('#jobs-table tbody tr', (trs) => trs.map((t) => t.getAttribute('data-job')));
  check('admin sees every tenant\'s jobs', all.includes(JOB_B) && all.includes(JOB_LIVE), all.join(','));
  await adm.goto(`${URL0}#/job/${JOB_LIVE}`, {waitUntil: 'domcontentloaded'});
  await adm.waitForFunction((j) => document.querySelector('#job-title').textContent.startsWith(j), {timeout: 10000}, JOB_LIVE);
  check('admin gets no cancel button', await adm.$eval('#cancel', (b) => b.hidden));
  await adm.goto(`${URL0}#/cluster`, {waitUntil: 'domcontentloaded'});
  await adm.waitForFunction(() => document.querySelectorAll('#cluster-table tbody tr').length >= 4, {timeout: 10000})
    .then(() => check('the cluster view lists the four services', true))
    .catch(() => check('the cluster view lists the four services', false));
  await adm.waitForFunction(() => {
    const td = document.querySelector('#cluster-table tr[data-service="rollout"] td[data-key="tokens_per_s"]');
    return td && Number(td.textContent) > 0;
  }, {timeout: 15000})
    .then(() => check('the cluster view shows the rollout\'s tokens/s', true))
    .catch(() => check('the cluster view shows the rollout\'s tokens/s', false));
  await adm.screenshot({path: `${SHOTS}/console-cluster.png`});
  await adm.close();

  // --- what must never have happened ----------------------------------------------------------
  check('no alert or other dialog fired', dialogs.length === 0, dialogs.join(' | '));
  const withToken = urls.filter((u) => u.includes(TA) || u.includes(TADM) || u.includes(encodeURIComponent(TA)));
  check(`no token in any of the ${urls.length} URLs the browser requested or showed`, withToken.length === 0, withToken.join(' '));
  const csp = consoleErrors.filter((e) => /Content Security Policy/i.test(e));
  check('no Content-Security-Policy violation', csp.length === 0, csp.join(' | '));
} catch (e) {
  failed++;
  console.log(`FAILED: ${e.stack || e}`);
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
