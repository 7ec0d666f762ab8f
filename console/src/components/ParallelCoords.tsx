// Parallel coordinates of a study's trials: one vertical axis per parameter and one for the objective, one
// polyline per trial, coloured from best (blue) to worst (red); trials without a value (pruned, failed, running)
// in grey. Drawn on a canvas: a few hundred lines need no library.

import { useEffect, useRef } from "preact/hooks";
import { num } from "../format";
import { useWidth } from "../hooks";
import type { Study, Trial } from "../types";

interface Axis {
  name: string;
  position: (v: unknown) => number | null; // 0 (bottom) … 1 (top)
  ticks: [number, string][];
}

function axisFor(name: string, values: unknown[], log: boolean): Axis {
  const numeric = values.filter((v): v is number => typeof v === "number" && Number.isFinite(v));
  if (numeric.length === values.filter((v) => v !== null && v !== undefined).length && numeric.length > 0) {
    const f = (v: number) => (log && v > 0 ? Math.log10(v) : v);
    const lo = Math.min(...numeric.map(f));
    const hi = Math.max(...numeric.map(f));
    const span = hi - lo || 1;
    const position = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? (f(v) - lo) / span : null);
    const ticks: [number, string][] = [0, 0.5, 1].map((t) => {
      const raw = lo + t * span;
      return [t, num(log ? 10 ** raw : raw)];
    });
    return { name, position, ticks: hi === lo ? [[0.5, num(numeric[0])]] : ticks };
  }
  const categories = [...new Set(values.filter((v) => v !== null && v !== undefined).map(String))].sort();
  const step = categories.length > 1 ? 1 / (categories.length - 1) : 0;
  const place = (v: unknown) => {
    const i = categories.indexOf(String(v));
    return i < 0 ? null : categories.length > 1 ? i * step : 0.5;
  };
  return { name, position: place, ticks: categories.map((c) => [place(c) as number, c]) };
}

export function ParallelCoords({ study, trials }: { study: Study; trials: Trial[] }) {
  const [measure, width] = useWidth<HTMLDivElement>();
  const canvas = useRef<HTMLCanvasElement>(null);
  const height = 280;
  const params = Object.keys(study.spec.parameters);
  const objective = study.spec.objective;

  useEffect(() => {
    const el = canvas.current;
    if (!el || width <= 0) return;
    const dpr = window.devicePixelRatio || 1;
    el.width = width * dpr;
    el.height = height * dpr;
    el.style.width = `${width}px`;
    el.style.height = `${height}px`;
    const ctx = el.getContext("2d");
    if (!ctx) return;
    ctx.scale(dpr, dpr);
    ctx.clearRect(0, 0, width, height);

    const axes = [
      ...params.map((p) => axisFor(p, trials.map((t) => t.params[p]), Boolean(study.spec.parameters[p]?.log))),
      axisFor(objective.metric, trials.map((t) => t.value ?? null), false),
    ];
    const top = 28;
    const bottom = height - 20;
    const left = 40;
    const right = width - 60;
    const x = (i: number) => (axes.length > 1 ? left + (i * (right - left)) / (axes.length - 1) : (left + right) / 2);
    const y = (p: number) => bottom - p * (bottom - top);

    const values = trials.map((t) => t.value).filter((v): v is number => typeof v === "number");
    const lo = Math.min(...values);
    const hi = Math.max(...values);
    const goodness = (v: number) => {
      const t = hi === lo ? 1 : (v - lo) / (hi - lo);
      return objective.direction === "maximize" ? t : 1 - t;
    };
    // Worst first, so the best lines end up on top; trials without a value below them all.
    const ordered = [...trials].sort((a, b) => (a.value == null ? -1 : b.value == null ? 1 : goodness(a.value) - goodness(b.value)));
    for (const trial of ordered) {
      ctx.beginPath();
      let started = false;
      axes.forEach((axis, i) => {
        const v = i < params.length ? trial.params[params[i]] : trial.value;
        const p = axis.position(v);
        if (p === null) {
          started = false;
          return;
        }
        if (started) ctx.lineTo(x(i), y(p));
        else ctx.moveTo(x(i), y(p));
        started = true;
      });
      if (trial.value == null) {
        ctx.strokeStyle = "rgba(120,120,120,0.35)";
        ctx.lineWidth = 1;
      } else {
        const g = goodness(trial.value);
        ctx.strokeStyle = `hsla(${Math.round(g * 220)}, 75%, 45%, 0.8)`;
        ctx.lineWidth = trial.number === study.best?.number ? 3 : 1.4;
      }
      ctx.stroke();
    }

    ctx.font = "12px system-ui, sans-serif";
    ctx.textAlign = "center";
    axes.forEach((axis, i) => {
      ctx.strokeStyle = "#333";
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(x(i), top);
      ctx.lineTo(x(i), bottom);
      ctx.stroke();
      ctx.fillStyle = "#111";
      ctx.textAlign = "center";
      ctx.fillText(axis.name, x(i), top - 12);
      ctx.textAlign = "left";
      ctx.fillStyle = "#555";
      for (const [p, label] of axis.ticks.slice(0, 12)) ctx.fillText(label.slice(0, 12), x(i) + 4, y(p) + 4);
    });
  }, [width, trials, study]);

  const label = `Parallel coordinates of ${trials.length} trials over ${params.join(", ")} and ${objective.metric}`;
  return (
    <div ref={measure} class="parcoords">
      <canvas ref={canvas} role="img" aria-label={label} data-testid="parallel-coordinates" data-trials={trials.length} />
    </div>
  );
}
