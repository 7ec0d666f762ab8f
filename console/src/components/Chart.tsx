// One uPlot chart: several lines on a shared x (steps, or wall time in seconds), optional log scale and
// smoothing. uPlot draws on a canvas and stays fast with tens of thousands of points; the console never hands it
// more than the server's downsampled series (about one point per pixel of width).

import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { num } from "../format";
import { useWidth } from "../hooks";

export interface ChartLine {
  label: string;
  xs: number[];
  ys: (number | null)[];
  /** Dots, not a line (a study's trials). */
  dots?: boolean;
  /** Dots drawn as rings (e.g. a study's pruned trials, beside the finished ones' filled dots). */
  hollow?: boolean;
  /** Its own colour instead of the palette's next. */
  colour?: string;
  /** Drawn from the other lines' points (e.g. best so far): not counted among the chart's points. */
  derived?: boolean;
}

interface Props {
  title: string;
  lines: ChartLine[];
  xTime?: boolean;
  xLabel?: string;
  logScale?: boolean;
  smoothing?: number; // 0 (none) … 0.99
  height?: number;
  count?: number; // points in range on the server, before downsampling
  /** The caption's count of what is drawn (default: "N points"); `data-points` is that count too. */
  countLabel?: (drawn: number) => string;
  yFormat?: (v: number) => string;
  /** A drag selected this x range (null: reset), for a caller that reloads the range in more detail. */
  onZoom?: (range: [number, number] | null) => void;
  testid?: string;
  /** A performance mark set when the first chart that names it has drawn (besides kiln:first-chart). */
  mark?: string;
}

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f", "#a16207", "#475569"];
export const colour = (i: number): string => PALETTE[i % PALETTE.length];

/** TensorBoard's smoothing: an exponential moving average, debiased so the first points are not pulled to 0. */
export function smooth(ys: (number | null)[], weight: number): (number | null)[] {
  if (weight <= 0) return ys;
  let last = 0;
  let n = 0;
  return ys.map((y) => {
    if (y === null || !Number.isFinite(y)) return null;
    last = last * weight + (1 - weight) * y;
    n++;
    return last / (1 - weight ** n);
  });
}

function alpha(hex: string, a: number): string {
  const v = parseInt(hex.slice(1), 16);
  return `rgba(${(v >> 16) & 255},${(v >> 8) & 255},${v & 255},${a})`;
}

/** A line of one point draws no line: its point is drawn as a dot instead (a run that logged a metric once). */
function lonePoint(ys: (number | null)[], stroke: string): uPlot.Series.Points {
  const one = ys.filter((y) => y !== null && Number.isFinite(y)).length === 1;
  return one ? { show: true, size: 7, width: 1.5, stroke, fill: stroke } : { show: false };
}

/** The x scale of points that all share one x: uPlot would give it no width (and draw nothing); one step each side. */
function xRange(_u: uPlot, min: number | null, max: number | null): uPlot.Range.MinMax {
  if (min === null || max === null) return [min, max];
  return min === max ? [min - 1, max + 1] : [min, max];
}

function build(lines: ChartLine[], logScale: boolean, smoothing: number, xLabel: string): { data: uPlot.AlignedData; series: uPlot.Series[] } {
  const tables: uPlot.AlignedData[] = [];
  const series: uPlot.Series[] = [{ label: xLabel }];
  const clean = (ys: (number | null)[]) => (logScale ? ys.map((y) => (y !== null && y > 0 ? y : null)) : ys);
  lines.forEach((line, i) => {
    const ys = clean(line.ys);
    const stroke = line.colour ?? colour(i);
    if (line.dots) {
      tables.push([line.xs, ys]);
      const fill = line.hollow ? "#fff" : stroke;
      series.push({ label: line.label, stroke, fill, paths: () => null, points: { show: true, size: 7, width: 1.5, stroke, fill } });
    } else if (smoothing > 0) {
      tables.push([line.xs, ys]);
      series.push({ label: `${line.label} (raw)`, stroke: alpha(stroke, 0.25), width: 1, spanGaps: true, points: { show: false } });
      tables.push([line.xs, smooth(ys, smoothing)]);
      series.push({ label: line.label, stroke, width: 1.5, spanGaps: true, points: lonePoint(ys, stroke) });
    } else {
      tables.push([line.xs, ys]);
      series.push({ label: line.label, stroke, width: 1.5, spanGaps: true, points: lonePoint(ys, stroke) });
    }
  });
  const data = tables.length === 1 ? tables[0] : uPlot.join(tables);
  return { data, series };
}

let firstChartMarked = false;
const marked = new Set<string>();

export function Chart(props: Props) {
  const { title, lines, xTime = false, logScale = false, smoothing = 0, height = 220, yFormat, onZoom } = props;
  const [measure, width] = useWidth<HTMLDivElement>();
  const host = useRef<HTMLDivElement>(null);
  const fig = useRef<HTMLElement>(null);
  const plot = useRef<uPlot | null>(null);
  const shape = useRef("");
  const zoomRef = useRef(onZoom);
  zoomRef.current = onZoom;
  const points = lines.reduce((n, l) => n + (l.derived ? 0 : l.xs.length), 0);

  useEffect(() => {
    if (!host.current || width <= 0 || lines.every((l) => l.xs.length === 0)) {
      plot.current?.destroy();
      plot.current = null;
      shape.current = "";
      return;
    }
    const { data, series } = build(lines, logScale, smoothing, props.xLabel ?? (xTime ? "time" : "x"));
    const key = `${series.map((s) => s.label).join("|")}:${xTime}:${logScale}:${smoothing > 0}`;
    if (plot.current && shape.current === key) {
      plot.current.setData(data);
      return;
    }
    plot.current?.destroy();
    shape.current = key;
    const opts: uPlot.Options = {
      width,
      height,
      series,
      scales: { x: xTime ? { time: true } : { time: false, range: xRange }, y: logScale ? { distr: 3, log: 10 } : {} },
      axes: [
        { label: props.xLabel, labelSize: props.xLabel ? 18 : 0, stroke: "#555", grid: { stroke: "#eee" } },
        {
          stroke: "#555",
          grid: { stroke: "#eee" },
          values: (_u, vals) => vals.map((v) => (v === null ? "" : yFormat ? yFormat(v) : num(v))),
          // As wide as its longest label (uPlot's default cuts "12.5 MiB" off).
          size: (_u, values) => 14 + 7 * Math.max(3, ...(values ?? []).map((v) => String(v).length)),
        },
      ],
      legend: { live: true },
      cursor: { drag: { x: true, y: false, setScale: true } },
      hooks: {
        draw: [
          () => {
            if (fig.current) fig.current.dataset.ready = "true";
            if (!firstChartMarked) {
              firstChartMarked = true;
              performance.mark("kiln:first-chart");
            }
            if (props.mark && !marked.has(props.mark)) {
              marked.add(props.mark);
              performance.mark(props.mark);
            }
          },
        ],
        setSelect: [
          (u) => {
            if (u.select.width > 2 && zoomRef.current) {
              const lo = u.posToVal(u.select.left, "x");
              const hi = u.posToVal(u.select.left + u.select.width, "x");
              zoomRef.current([lo, hi]);
            }
          },
        ],
      },
    };
    plot.current = new uPlot(opts, data, host.current);
    const reset = () => zoomRef.current?.(null);
    plot.current.over.addEventListener("dblclick", reset);
    plot.current.over.setAttribute("aria-label", `${title}: chart`);
  }, [lines, width, height, xTime, logScale, smoothing]);

  useEffect(() => () => plot.current?.destroy(), []);

  const empty = lines.every((l) => l.xs.length === 0);
  return (
    <figure ref={fig} class="chart" data-testid={props.testid ?? "chart"} data-metric={title} data-points={points} data-count={props.count ?? points}>
      <figcaption>
        <span class="chart-title">{title}</span>
        {props.countLabel ? (
          <span class="muted small"> {props.countLabel(points)}</span>
        ) : props.count !== undefined && props.count > points ? (
          <span class="muted small"> {points.toLocaleString()} of {props.count.toLocaleString()} points</span>
        ) : (
          <span class="muted small"> {points.toLocaleString()} points</span>
        )}
      </figcaption>
      <div ref={measure} class="chart-area">
        {empty ? <p class="muted empty">No points in this range.</p> : <div ref={host} />}
      </div>
    </figure>
  );
}
