// Opens every page of the built site in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core)
// and fails on: a page that does not load, a request that fails (a missing image, script or style sheet), a request
// that leaves the site (pages must work offline), a console error or page error, an image that is not shown, math
// that MathJax did not typeset or typeset as an error (red: an undefined macro), raw `$...$`, `\(...\)`, `\[...\]`
// or a TeX command left in prose (code and outputs are not prose), a link inside the site to a page or an anchor that
// does not exist. It notes (without failing) display formulas wider than the text column, and takes screenshots.
// Called by tools/site_check.sh:  node check.cjs SITE_DIR SHOT_DIR HTTP_BASE [file]
// Each page is opened over HTTP_BASE (python -m http.server) and, with `file`, from file:// too.
'use strict';
const fs = require('fs');
const path = require('path');
const { pathToFileURL, fileURLToPath } = require('url');
const { chromium } = require(process.env.PLAYWRIGHT_CORE || 'playwright-core');

const [siteDir, shotDir, httpBase, fileMode] = process.argv.slice(2);
const SITE = path.resolve(siteDir);
const PAGE_TIMEOUT = 1000 * Number(process.env.SITE_CHECK_PAGE_TIMEOUT || 180);
const SHOTS = (process.env.SITE_CHECK_SHOTS || '00_overview,05_performer,20_study,names').split(',');

function htmlPages(dir, rel = '') {
  const out = [];
  for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
    const r = path.posix.join(rel, e.name);
    if (e.isDirectory()) { if (!/^(_static|_images|_sources|notebooks|_downloads)$/.test(e.name)) out.push(...htmlPages(dir, r)); }
    else if (e.name.endsWith('.html')) out.push(r);
  }
  return out.sort();
}

// ids of each page, for the links' anchors
const idCache = new Map();
function idsOf(file) {
  if (!idCache.has(file)) {
    const s = fs.readFileSync(file, 'utf8');
    const ids = new Set();
    for (const m of s.matchAll(/\s(?:id|name)="([^"]+)"/g)) ids.add(m[1].replace(/&amp;/g, '&').replace(/&quot;/g, '"'));
    idCache.set(file, ids);
  }
  return idCache.get(file);
}

// A link inside the site -> null if fine, else what is wrong with it.
function checkLink(href, pageFile) {
  let target, frag = '';
  const hash = href.indexOf('#');
  if (hash >= 0) { frag = decodeURIComponent(href.slice(hash + 1)); href = href.slice(0, hash); }
  const q = href.indexOf('?'); if (q >= 0) href = href.slice(0, q);
  if (href === '') target = pageFile;
  else target = path.resolve(path.dirname(pageFile), decodeURIComponent(href));
  if (!target.startsWith(SITE)) return 'points outside the site folder';
  if (fs.existsSync(target) && fs.statSync(target).isDirectory()) target = path.join(target, 'index.html');
  if (!fs.existsSync(target)) return `no file ${path.relative(SITE, target)}`;
  if (frag && target.endsWith('.html') && !idsOf(target).has(frag)) return `no anchor #${frag} in ${path.relative(SITE, target)}`;
  return null;
}

// Runs in the page: waits for MathJax to finish, then looks at math, images, prose and links.
async function inspect() {
  const wait = (ms) => new Promise((r) => setTimeout(r, ms));
  const res = { math: 0, typeset: 0, mathErrors: [], wide: [], images: 0, badImages: [], raw: [], links: [], title: document.title };
  if (document.querySelector('script[src*="_static/mathjax/"]')) {
    for (let i = 0; i < 1200 && !(window.MathJax && window.MathJax.startup && window.MathJax.startup.promise); i++) await wait(100);
    if (!(window.MathJax && window.MathJax.startup)) res.mathErrors.push('MathJax did not start');
    else await window.MathJax.startup.promise;
  }
  for (const el of document.querySelectorAll('.math')) {
    res.math++;
    if (el.querySelector('mjx-container')) res.typeset++;
    else res.mathErrors.push('not typeset: ' + el.textContent.replace(/\s+/g, ' ').trim().slice(0, 80));
    const bad = el.querySelector('[data-mml-node="merror"], [fill="red"]');  // a TeX error, an undefined macro
    if (bad) {
      const item = [...((window.MathJax.startup.document || {}).math || [])].find((m) => el.contains(m.typesetRoot));
      res.mathErrors.push(`TeX error (${bad.getAttribute('data-mjx-error') || 'undefined macro, shown red'}) in: ` +
                          (item ? item.math : el.textContent).replace(/\s+/g, ' ').trim().slice(0, 100));
    }
  }
  // a display formula wider than the column: site.css draws it smaller to fit; noted, as a line break would read better
  for (const c of document.querySelectorAll('mjx-container[display="true"]')) {
    const svg = c.querySelector('svg'), box = c.closest('div.math') || c.parentElement;
    if (!svg) continue;
    svg.style.maxWidth = 'none';
    const natural = svg.getBoundingClientRect().width;
    svg.style.maxWidth = '';
    if (natural > box.clientWidth + 1) {
      const item = [...((window.MathJax.startup.document || {}).math || [])].find((m) => m.typesetRoot === c);
      res.wide.push(`${Math.round(natural)} px in a ${box.clientWidth} px column (drawn at ` +
                    `${Math.round(100 * box.clientWidth / natural)}%): ` + (item ? item.math : '').replace(/\s+/g, ' ').trim().slice(0, 80));
    }
  }
  for (const img of document.querySelectorAll('img')) {
    res.images++;
    img.loading = 'eager';
    if (!img.complete) await new Promise((r) => { img.onload = img.onerror = r; setTimeout(r, 20000); });
    if (!img.naturalWidth) res.badImages.push(img.getAttribute('src'));
  }
  // prose: the article without code, outputs, typeset math and scripts
  const art = (document.querySelector('article') || document.body).cloneNode(true);
  art.querySelectorAll('pre, code, script, style, .highlight, .cell_output, .output, .math, .MathJax_SVG, .MathJax_SVG_Display, .MathJax_Preview, mjx-container, .headerlink')
    .forEach((e) => e.remove());
  const text = art.textContent;
  // math delimiters, a `$` pair as MyST would read it, or a TeX command (`\frac`, `\phi`): prose has none of them
  const re = /\$\$[^$]+\$\$|\$(?=\S)[^$\n]{1,300}?(?<=\S)\$(?!\d)|\\\(|\\\)|\\\[|\\\]|\\[A-Za-z]{2,}/g;
  for (const m of text.matchAll(re)) res.raw.push(text.slice(Math.max(0, m.index - 40), m.index + m[0].length + 40).replace(/\s+/g, ' '));
  for (const a of document.querySelectorAll('a[href]')) res.links.push(a.getAttribute('href'));
  return res;
}

(async () => {
  const pages = htmlPages(SITE);
  fs.mkdirSync(shotDir, { recursive: true });
  // Chromium as this machine needs it (no sandbox as root, no GPU, no background connections to the closed network);
  // playwright starts it with a fresh, empty profile (user data dir) of its own each time.
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, deviceScaleFactor: 1 });
  const modes = [['http', httpBase.replace(/\/?$/, '/')]];
  if (fileMode === 'file') modes.push(['file', pathToFileURL(SITE).href + '/']);
  const failures = [];
  const external = new Map();
  let nMath = 0, nImages = 0, nLinks = 0, nWide = 0;
  const wide = [];
  const t0 = Date.now();
  for (const [mode, base] of modes) {
    for (const rel of pages) {
      const url = base + rel;
      const page = await context.newPage();
      const problems = [];
      page.on('console', (m) => { if (m.type() === 'error') problems.push('console error: ' + m.text().slice(0, 200)); });
      page.on('pageerror', (e) => problems.push('page error: ' + String(e).slice(0, 200)));
      page.on('requestfailed', (r) => {
        if (!r.failure() || r.failure().errorText !== 'net::ERR_BLOCKED_BY_CLIENT')
          problems.push(`request failed: ${r.url().replace(base, '')} (${r.failure() && r.failure().errorText})`);
      });
      page.on('response', (r) => { if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.url().replace(base, '')}`); });
      await page.route('**/*', (route) => {
        const u = route.request().url();
        if (u.startsWith(base) || u.startsWith('data:') || u.startsWith('blob:')) return route.continue();
        problems.push('request leaves the site: ' + u.slice(0, 120));
        return route.abort('blockedbyclient');
      });
      let res = null;
      try {
        const resp = await page.goto(url, { waitUntil: 'load', timeout: PAGE_TIMEOUT });
        if (mode === 'http' && (!resp || !resp.ok())) problems.push(`page did not load: ${resp ? resp.status() : 'no response'}`);
        if (rel === 'index.html') await page.waitForURL(/00_overview\.html/, { timeout: PAGE_TIMEOUT }).catch(() => problems.push('index.html does not lead to the home page'));
        res = await page.evaluate(inspect);
      } catch (e) {
        problems.push('page did not load: ' + String(e).split('\n')[0]);
      }
      if (res) {
        if (!res.title) problems.push('no title');
        problems.push(...res.mathErrors, ...res.badImages.map((s) => 'image not shown: ' + s), ...res.raw.map((s) => 'raw math in prose: ' + s));
        nMath += res.math; nImages += res.images;
        const finalUrl = page.url().split('#')[0];  // index.html leads to the home page: its links are that page's
        const pageFile = finalUrl.startsWith('file:') ? fileURLToPath(finalUrl) : path.join(SITE, decodeURIComponent(finalUrl.slice(base.length)));
        for (const href of res.links) {
          if (/^(https?:)?\/\//.test(href)) { const h = new URL(href, 'http://x').host; external.set(h, (external.get(h) || 0) + 1); continue; }
          if (/^(mailto|javascript|data):/.test(href)) continue;
          nLinks++;
          const bad = checkLink(href, pageFile);
          if (bad) problems.push(`broken link ${href}: ${bad}`);
        }
        const stem = rel.replace(/\.html$/, '');
        if (mode === 'http' && SHOTS.includes(stem)) {
          await page.screenshot({ path: path.join(shotDir, `${stem}.png`) });
          for (const [what, sel] of [['math', 'div.math'], ['figure', '.cell_output img'], ['solution', '.toggle-hidden, details.hide, .tag_hide-cell']]) {
            const el = page.locator(sel).first();
            if (await el.count()) {
              await el.evaluate((e) => e.scrollIntoView({ block: 'center' }));
              await page.waitForTimeout(300);
              await page.screenshot({ path: path.join(shotDir, `${stem}_${what}.png`) });
            }
          }
        }
      }
      const uniq = [...new Set(problems)];
      if (res && res.wide.length) { nWide += res.wide.length; if (mode === 'http') wide.push(...res.wide.map((w) => `${rel}: ${w}`)); }
      console.log(`${uniq.length ? 'FAIL' : 'ok  '} ${mode.padEnd(4)} ${rel}` + (res ? `  (${res.math} math, ${res.images} images, ${res.links.length} links)` : ''));
      for (const p of uniq.slice(0, 30)) console.log('       ' + p);
      if (uniq.length > 30) console.log(`       ... and ${uniq.length - 30} more`);
      if (uniq.length) failures.push([mode, rel, uniq.length]);
      await page.close();
    }
  }
  await browser.close();
  console.log(`\nsite check: ${pages.length} pages x ${modes.map((m) => m[0]).join(' + ')}, ${nMath} math elements, ${nImages} images, ` +
              `${nLinks} internal links checked, in ${((Date.now() - t0) / 1000).toFixed(0)} s`);
  console.log('external links (not followed): ' + ([...external].map(([h, n]) => `${h} (${n})`).join(', ') || 'none'));
  if (wide.length) {
    console.log(`note: ${wide.length} display formulas are wider than the text column (drawn smaller to fit; a line break in the notebook would read better):`);
    for (const w of wide) console.log('       ' + w);
  }
  console.log(`screenshots: ${path.resolve(shotDir)}`);
  if (failures.length) { console.log(`${failures.length} page loads FAILED`); process.exit(1); }
  console.log('every page passed');
})().catch((e) => { console.error(e); process.exit(2); });
