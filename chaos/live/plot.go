package live

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The plot's size: 1200 × 800 pixels.
const (
	plotWidth  = 12 * vg.Inch
	plotHeight = 8 * vg.Inch
	plotDPI    = 100
)

// How each outcome is drawn.
var classStyle = [classes]struct {
	color color.Color
	shape draw.GlyphDrawer
	size  vg.Length
}{
	Correct:    {color.RGBA{G: 140, B: 60, A: 255}, draw.CircleGlyph{}, 2},
	Refused:    {color.RGBA{B: 200, A: 255}, draw.SquareGlyph{}, 2.5},
	CleanError: {color.RGBA{R: 230, G: 140, A: 255}, draw.TriangleGlyph{}, 3},
	Cancelled:  {color.Gray{Y: 120}, draw.RingGlyph{}, 2.5},
	Wrong:      {color.RGBA{R: 220, A: 255}, draw.CrossGlyph{}, 5},
}

// WritePlot draws the report as a PNG: above, each request's latency
// (log scale) at the time it was sent, by outcome, over the windows of the
// faults that take a node out (kill, pause, partition, drain) shaded by
// kind;
// below, every fault window, one lane per kind.
func (r *Report) WritePlot(w io.Writer) error {
	end := math.Max(time.Duration(r.Wall).Seconds(), 1)
	top, err := r.latencyPlot(end)
	if err != nil {
		return err
	}
	bottom, err := r.faultPlot(end)
	if err != nil {
		return err
	}
	img := vgimg.NewWith(vgimg.UseWH(plotWidth, plotHeight), vgimg.UseDPI(plotDPI))
	dc := draw.New(img)
	// Three parts latency to one part faults.
	upper := draw.Crop(dc, 0, 0, plotHeight/4, 0)
	lower := draw.Crop(dc, 0, 0, 0, -3*plotHeight/4)
	top.Draw(upper)
	bottom.Draw(lower)
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// kindColor is the color of a kind's windows, translucent with alpha.
func kindColor(k Kind, alpha uint8) color.Color {
	r, g, b, _ := plotutil.Color(int(k)).RGBA()
	return color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: alpha}
}

func (r *Report) latencyPlot(end float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("chaos campaign, seed %d: %d requests, %d wrong", r.Seed, r.Requests.Total, r.Wrong)
	p.X.Label.Text = "request sent at (s)"
	p.Y.Label.Text = "latency (s)"
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.X.Min, p.X.Max = 0, end
	lo, hi := math.Inf(1), 0.0
	points := make([]plotter.XYs, classes)
	for _, rec := range r.Records {
		lat := math.Max((time.Duration(rec.End) - time.Duration(rec.Start)).Seconds(), 1e-4)
		lo, hi = math.Min(lo, lat), math.Max(hi, lat)
		points[rec.Class] = append(points[rec.Class], plotter.XY{X: time.Duration(rec.Start).Seconds(), Y: lat})
	}
	if hi == 0 {
		lo, hi = 1e-3, 1
	}
	p.Y.Min, p.Y.Max = lo/1.5, hi*1.5
	for _, f := range r.FaultLog {
		if !f.Kind.disrupts() {
			continue // in the lanes below only: shading every window hides the points
		}
		band, err := window(f, p.Y.Min, p.Y.Max)
		if err != nil {
			return nil, err
		}
		band.Color, band.LineStyle.Width = kindColor(f.Kind, 40), 0
		p.Add(band)
	}
	for c := range classes {
		if len(points[c]) == 0 {
			continue
		}
		s, err := plotter.NewScatter(points[c])
		if err != nil {
			return nil, err
		}
		st := classStyle[c]
		s.GlyphStyle.Color, s.GlyphStyle.Shape, s.GlyphStyle.Radius = st.color, st.shape, st.size
		p.Add(s)
		p.Legend.Add(fmt.Sprintf("%s (%d)", c, len(points[c])), s)
	}
	p.Legend.Top, p.Legend.Left = true, true
	return p, nil
}

// window is the rectangle of a fault's window from y0 to y1.
func window(f FaultRecord, y0, y1 float64) (*plotter.Polygon, error) {
	x0, x1 := time.Duration(f.Start).Seconds(), time.Duration(f.End).Seconds()
	return plotter.NewPolygon(plotter.XYs{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}})
}

func (r *Report) faultPlot(end float64) (*plot.Plot, error) {
	p := plot.New()
	p.X.Label.Text = "fault windows (s)"
	p.X.Min, p.X.Max = 0, end
	var kinds []Kind
	for _, f := range r.FaultLog {
		if !slices.Contains(kinds, f.Kind) {
			kinds = append(kinds, f.Kind)
		}
	}
	slices.Sort(kinds)
	var ticks []plot.Tick
	for i, k := range kinds {
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: k.String()})
	}
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Min, p.Y.Max = -0.5, math.Max(float64(len(kinds))-0.5, 0.5)
	for _, f := range r.FaultLog {
		lane := float64(slices.Index(kinds, f.Kind))
		bar, err := window(f, lane-0.35, lane+0.35)
		if err != nil {
			return nil, err
		}
		bar.Color, bar.LineStyle.Width = kindColor(f.Kind, 220), 0
		if f.Err != "" {
			bar.LineStyle.Width, bar.LineStyle.Color = vg.Points(1.5), color.RGBA{R: 220, A: 255}
		}
		p.Add(bar)
	}
	return p, nil
}
